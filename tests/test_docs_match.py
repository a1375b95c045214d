"""docs/api.md, docs/operator.md and docs/miner.md state what the code does.

Facts are read from the docs' text, not copied into this file: the routes (`GET /path` spans, with
their query parameters), every HTTP status code the API and prover pages state (each is located by
the sentence that states it and compared with what the real app answers in that case; a status
code in the text that no sentence here accounts for is itself a failure), the config defaults and
keys (`key (default V)`, `the default key = value`, the TOML snippets, `POT_<SECTION>_<KEY>`, and
every key of examples/node.toml), and every `pot ...` command and option of the three docs (walked
in the click tree of `pot.cli.app`) with the defaults they state.

Each checker is a function from a doc's text to a list of problems, so the tests also run it over
copies of the docs with a wrong fact planted, and check that it finds the fact.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from fastapi.testclient import TestClient
from starlette.routing import Mount
from typer.testing import CliRunner

from node.api import DOCS_ASSETS, create_app
from node.config import ConfigError, NodeConfig, load_config
from node.db import challenges, make_engine, open_database

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLE_CONFIG = ROOT / "examples" / "node.toml"
BASE = "http://127.0.0.1:8700"
TOKEN = "docs-match-admin-token-0123"
UNKNOWN = "ab" * 32


def read_doc(name: str) -> str:
    return (DOCS / name).read_text()


def flat(text: str) -> str:
    """The text with every run of white space made one space: a sentence reads the same however
    its lines are wrapped."""
    return re.sub(r"\s+", " ", text)


def without_fences(text: str) -> str:
    """The text with its fenced code blocks blanked (same length, so positions still hold)."""
    return re.sub(r"```.*?```", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def code_spans(text: str) -> list[tuple[int, str]]:
    """(position, content) of every inline code span outside fenced blocks."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"`([^`\n]+)`", without_fences(text))]


def section(text: str, heading: str) -> str:
    """The part of a doc from a heading line to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m, f"no heading {heading!r}"
    level = len(m.group(1))
    rest = text[m.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return text[m.start(): m.end() + (end.start() if end else len(rest))]


def _context(text: str, pos: int) -> str:
    return text[max(0, pos - 60): pos + 60].replace("\n", " ")


# --- routes ------------------------------------------------------------------------------------

ROUTE_SPAN = re.compile(r"^(GET|POST|PUT|PATCH|DELETE) (/[^?]*?)(\?\S*)?$")


def _template(path: str) -> str:
    """A route path with its parameters unnamed: the docs write `{id}` where the code has `{run_id}`."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def route_problems(text: str, app: Any) -> list[str]:
    """Every `METHOD /path` span of the doc is a route of the app with that method (and, when the
    span lists query parameters, exactly the route's); every GET route and every mount of the app
    appears in the doc as a code span."""
    routes: dict[tuple[str, str], Any] = {}
    mounts = []
    for r in app.routes:
        if isinstance(r, Mount):
            mounts.append(r.path)
        elif hasattr(r, "methods"):
            for method in r.methods - {"HEAD"}:
                routes[(method, _template(r.path))] = r
    schema = app.openapi() if getattr(app, "openapi_url", None) else {"paths": {}}
    problems, paths = [], set()
    for pos, span in code_spans(text):
        for word in _template(span).split():
            if word.startswith("/"):
                paths.add(_template(word.split("?")[0]))
        m = ROUTE_SPAN.match(span)
        if not m:
            continue
        method, path, query = m.group(1), m.group(2), m.group(3)
        route = routes.get((method, _template(path)))
        if route is None:
            have = sorted(f"{k[0]} {k[1]}" for k in routes if k[1] == _template(path))
            problems.append(f"the doc names `{method} {path}` (near {_context(text, pos)!r}); the app has no "
                            f"such route{' (it has ' + ', '.join(have) + ')' if have else ''}")
            continue
        if query is not None:
            stated = {kv.split("=")[0] for kv in query[1:].split("&") if kv}
            op = schema["paths"].get(route.path, {}).get(method.lower(), {})
            actual = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            if stated != actual:
                problems.append(
                    f"`{method} {path}` lists the query parameters {sorted(stated)}; the route takes "
                    f"{sorted(actual)}"
                )
    for (method, path), route in sorted(routes.items()):
        if method == "GET" and path not in paths:
            problems.append(f"the app serves GET {route.path}, which the doc never names")
    for mount in mounts:
        if not any(p.startswith(mount + "/") for p in paths):
            problems.append(f"the app serves files under {mount}/, which the doc never names")
    return problems


# --- status codes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A sentence of a doc that states status codes: `pattern` finds it in the flattened text, each
    capture group is one stated code (`404`, or a class `4xx`), and `observe` returns, per group,
    what the real app answered in the cases the sentence is about."""

    name: str
    pattern: str
    observe: Callable[[Any], list[set[Any]]]


# A status code in the text: three digits 100..599 or a class `4xx`, not part of an address, a
# version, a range or a longer number.
MENTION = re.compile(r"(?<![\w.:/,-])([1-5]\d\d|[1-5]xx)(?![\w:/-]|[.,]\d)")
# A mention that states what nothing answers ("no 5xx", "without a 5xx") is no claim about a case.
NEGATED = re.compile(r"(?:\bno|without a|never a|never)\s*$")


def agrees(stated: str, got: Any) -> bool:
    """A stated code and an observation: an int status, or a string (a label value, or the
    description of an answer that was not what the doc says, which never agrees)."""
    if isinstance(got, str):
        return got == stated
    if stated.endswith("xx"):
        return str(got)[0] == stated[0]
    return got == int(stated)


def status_problems(text: str, claims: list[Claim], observe: Callable[[Claim], list[set[Any]]]) -> list[str]:
    body = flat(without_fences(text))
    problems, spans = [], []
    for c in claims:
        m = re.search(c.pattern, body)
        if m is None:
            problems.append(
                f"{c.name}: the doc no longer has the sentence /{c.pattern}/; update the claim with it"
            )
            continue
        spans.append(m.span())
        observed = observe(c)
        assert len(observed) == len(m.groups()), c.name
        for i, got in enumerate(observed, 1):
            stated = m.group(i)
            bad = [g for g in got if not agrees(stated, g)]
            if bad or not got:
                problems.append(f"{c.name}: the doc states {stated} ({m.group(0)[:120]!r}); the code answers "
                                f"{sorted(map(str, got))}")
    for m in MENTION.finditer(body):
        if NEGATED.search(body[max(0, m.start() - 12): m.start()]):
            continue
        if not any(a <= m.start() < b for a, b in spans):
            problems.append(
                f"the status {m.group(1)} stated at {_context(body, m.start())!r} is checked by no claim"
            )
    return problems


class NodeApi:
    """Fresh node databases (SQLite) and the real app over them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.engines: list[Any] = []
        self.cache: dict[str, list[set[Any]]] = {}

    def engine(self, seeded: bool = True):
        from tests.node.api_data import seed

        eng = open_database(f"sqlite:///{self.tmp / f'node{len(self.engines)}.db'}", init=True)
        self.engines.append(eng)
        return eng, (seed(eng) if seeded else None)

    def close(self) -> None:
        for eng in self.engines:
            eng.dispose()

    def client(self, engine, **kw) -> TestClient:
        return TestClient(create_app(engine, NodeConfig(), **kw), base_url=BASE)

    def observe(self, claim: Claim) -> list[set[Any]]:
        if claim.name not in self.cache:
            self.cache[claim.name] = claim.observe(self)
        return self.cache[claim.name]


def _json_detail(r) -> bool:
    try:
        return isinstance(r.json().get("detail"), (str, list))
    except ValueError:
        return False


def _answer(r, path: str) -> Any:
    """The status, or what was wrong with an answer the doc describes as JSON with a `detail`."""
    if not _json_detail(r):
        return f"{r.status_code} without a JSON detail at {path}"
    return r.status_code


def obs_readyz(env: NodeApi) -> list[set[Any]]:
    ready_eng, _ = env.engine()
    fresh_eng, _ = env.engine(seeded=False)  # no block followed yet: chain_head fails
    with env.client(ready_eng) as ready, env.client(fresh_eng) as fresh:
        return [{ready.get("/readyz").status_code}, {fresh.get("/readyz").status_code}]


HOST_PATHS = ["/api/v1/status", "/healthz", "/metrics", "/", f"/runs/{UNKNOWN}", "/static/live.js",
              f"{DOCS_ASSETS}/swagger-ui.css", "/openapi.json"]


def obs_host(env: NodeApi) -> list[set[Any]]:
    eng, _ = env.engine()
    foreign, bad = set(), set()
    with env.client(eng) as c:
        for path in HOST_PATHS:
            foreign.add(_answer(c.get(path, headers={"Host": "attacker.example:8700"}), path))
            foreign.add(_answer(c.get(path, headers={"Host": "ATTACKER.example."}), path))
            bad.add(_answer(c.get(path, headers={"Host": ""}), path))  # missing
            bad.add(_answer(c.get(path, headers={"Host": "127.0.0.1:87x0"}), path))  # malformed
            bad.add(_answer(c.get(path, headers={"Host": "two words"}), path))
            if c.get(path).status_code == 421:  # the node's own name is served
                foreign.add(f"421 for the node's own name at {path}")
        metrics = c.get("/metrics").text
    if 'route="unmatched"' not in metrics:
        foreign.add("refused requests missing from pot_http_requests_total (route unmatched)")
    return [foreign, bad]


def obs_schema_errors(env: NodeApi) -> list[set[Any]]:
    eng, _ = env.engine()
    outside = ["/api/v1/challenges/xyz", f"/api/v1/runs/{UNKNOWN}00", "/api/v1/challenges?status=bogus",
               "/api/v1/challenges?limit=0", "/api/v1/runs?limit=501", "/api/v1/challenges?cursor=12",
               "/api/v1/challenges?stage=nowhere"]
    with env.client(eng) as c:
        got = {path: c.get(path) for path in outside}
        unknown = [c.get(f"/api/v1/runs/{UNKNOWN}"), c.get(f"/api/v1/challenges/{UNKNOWN}")]
    every = {_answer(r, p) for p, r in got.items()} | {_answer(r, "unknown id") for r in unknown}
    return [every, {r.status_code for r in got.values()}]


def obs_unknown_id(env: NodeApi) -> list[set[Any]]:
    eng, _ = env.engine()
    with env.client(eng) as c:
        return [
            {
                _answer(c.get(f"/api/v1/runs/{UNKNOWN}"), "run"),
                _answer(c.get(f"/api/v1/challenges/{UNKNOWN}"), "challenge"),
            }
        ]


def obs_dashboard_errors(env: NodeApi) -> list[set[Any]]:
    eng, _ = env.engine()
    bad, unknown = set(), set()
    with env.client(eng) as c:
        for path in ["/runs/xyz", "/challenges/12", "/?status=bogus", "/?stage=nowhere", "/?cursor=12",
                     "/?run=zz"]:
            r = c.get(path)
            bad.add(
                r.status_code if r.headers["content-type"].startswith("text/html") else f"{path} is not HTML"
            )
        for path in [f"/runs/{UNKNOWN}", f"/challenges/{UNKNOWN}"]:
            r = c.get(path)
            unknown.add(
                r.status_code if r.headers["content-type"].startswith("text/html") else f"{path} is not HTML"
            )
    return [bad, unknown]


def dead_engine(tmp: Path):
    """An engine whose SQLite file cannot be opened: its folder was replaced by a file."""
    folder = tmp / f"gone-{len(list(tmp.iterdir()))}"
    engine = make_engine(f"sqlite:///{folder / 'node.db'}")  # makes the folder
    shutil.rmtree(folder)
    folder.write_text("")
    return engine


def obs_outage(env: NodeApi) -> list[set[Any]]:
    dead = dead_engine(env.tmp)
    got: set[Any] = set()
    try:
        with env.client(dead) as c:
            for path in ["/api/v1/status", "/api/v1/runs", "/api/v1/challenges", f"/api/v1/runs/{UNKNOWN}"]:
                got.add(_answer(c.get(path), path))
            ready, metrics = c.get("/readyz"), c.get("/metrics")
            if ready.status_code != 503 or ready.json()["checks"]["database"]["ok"] is not False:
                got.add(f"/readyz answered {ready.status_code} without reporting the database")
            if metrics.status_code != 200 or "pot_database_up 0.0" not in metrics.text:
                got.add(f"/metrics answered {metrics.status_code} without pot_database_up 0")
    finally:
        dead.dispose()
    return [got]


ADMIN_ROUTES = [
    ("post", f"/api/v1/admin/challenges/{UNKNOWN}/retry"),
    ("post", "/api/v1/admin/witness-conflicts/acknowledge"),
]


def _admin(env: NodeApi) -> dict[str, set[Any]]:
    eng, seeded = env.engine()
    out: dict[str, set[Any]] = {
        "none": set(),
        "wrong": set(),
        "disabled": set(),
        "ok": set(),
        "conflict": set(),
    }
    with env.client(eng, admin_token=TOKEN) as c:
        for method, path in ADMIN_ROUTES:
            out["none"].add(_answer(getattr(c, method)(path), path))
            out["wrong"].add(
                _answer(getattr(c, method)(path, headers={"Authorization": "Bearer not-the-token"}), path)
            )
        auth = {"Authorization": f"Bearer {TOKEN}"}
        out["ok"].add(
            c.post(f"/api/v1/admin/challenges/{seeded.retrying.hex()}/retry", headers=auth).status_code
        )
        out["ok"].add(c.post("/api/v1/admin/witness-conflicts/acknowledge", headers=auth).status_code)
        # The three reasons of a 409: a replay running, the commit window closed, nothing to re-queue.
        with eng.begin() as conn:
            conn.execute(sa.update(challenges).where(challenges.c.challenge_id == seeded.retrying)
                         .values(stage="replay", status="replaying"))
            conn.execute(sa.update(challenges).where(challenges.c.challenge_id == seeded.missed_fetch)
                         .values(commit_deadline=1))
        for cid in (seeded.retrying, seeded.missed_fetch, seeded.honest):
            out["conflict"].add(
                _answer(c.post(f"/api/v1/admin/challenges/{cid.hex()}/retry", headers=auth), cid.hex())
            )
    with env.client(eng) as c:  # no admin token configured
        for method, path in ADMIN_ROUTES:
            for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": "Basic eDp5"}):
                out["disabled"].add(_answer(getattr(c, method)(path, headers=headers), path))
    return out


def obs_admin(env: NodeApi) -> list[set[Any]]:
    a = _admin(env)
    return [a["none"], a["wrong"], a["disabled"]]


def obs_retry_conflict(env: NodeApi) -> list[set[Any]]:
    return [_admin(env)["conflict"]]


def obs_admin_tests(env: NodeApi) -> list[set[Any]]:
    a = _admin(env)
    return [a["none"], a["wrong"], a["ok"], a["conflict"]]


def obs_admin_disabled(env: NodeApi) -> list[set[Any]]:
    return [_admin(env)["disabled"]]


def obs_status_label(env: NodeApi) -> list[set[Any]]:
    eng, _ = env.engine()
    with env.client(eng) as c:
        c.get("/api/v1/status")
        c.get(f"/api/v1/runs/{UNKNOWN}")
        text = c.get("/metrics").text
    ok = set(re.findall(r'pot_http_requests_total\{[^}]*route="/api/v1/status"[^}]*status="([^"]+)"', text))
    return [ok or {"no pot_http_requests_total sample for /api/v1/status"}]


API_CLAIMS = [
    Claim("readiness", r"`GET /readyz` \|[^|]*?(\d{3}) when all pass, (\d{3}) otherwise", obs_readyz),
    Claim(
        "host check",
        r"Any other name is answered (\d{3}) and a missing or malformed Host (\d{3}), both JSON with "
        r"a `detail`, on every path",
        obs_host,
    ),
    Claim(
        "bad input",
        r"Bad input is a ([1-5]xx) with a `detail` that says what to fix: (\d{3}) for a parameter "
        r"outside the schema",
        obs_schema_errors,
    ),
    Claim("unknown id", r"`limit=0`\) and (\d{3}) for an unknown id", obs_unknown_id),
    Claim("API 400", r"so its (\d{3}) is the Host check's", lambda env: [obs_host(env)[1]]),
    Claim(
        "dashboard errors",
        r"The dashboard's pages answer (\d{3}) for an id, filter or cursor they cannot use and "
        r"(\d{3}) for an unknown id",
        obs_dashboard_errors,
    ),
    Claim(
        "database outage",
        r"A database outage is a (\d{3}) \(`/readyz` and `/metrics` keep answering",
        obs_outage,
    ),
    Claim(
        "admin token",
        r"without it they answer (\d{3}), with another token (\d{3}); with no token configured every "
        r"admin call is (\d{3})",
        obs_admin,
    ),
    Claim(
        "retry conflict",
        r"Otherwise (\d{3}) with the reason \(a replay is running, the window closed, the job is "
        r"done\)",
        obs_retry_conflict,
    ),
    Claim(
        "status label",
        r"`pot_http_requests_total` \| counter \| `method`, `route` \(template\), `status` "
        r"\(`([1-5]xx)`",
        obs_status_label,
    ),
    Claim("tests: admin", r"admin token (\d{3})/(\d{3})/(\d{3})/(\d{3})", obs_admin_tests),
    Claim(
        "tests: no admin token", r"an admin call on a node with no admin token is (\d{3})", obs_admin_disabled
    ),
    Claim(
        "tests: host",
        r"a rebinding name gets (\d{3}) on every path, malformed and missing Host (\d{3})",
        obs_host,
    ),
]

OPERATOR_CLAIMS = [
    Claim(
        "operator: host check", r"any other name gets (\d{3}), a missing or malformed Host (\d{3})", obs_host
    ),
]


class Prover:
    """The miner's prover app over a run folder holding one opening of 1,000 bytes."""

    DIGEST = "cd" * 32

    def __init__(self, tmp: Path) -> None:
        self.run = tmp / "run"
        (self.run / "openings").mkdir(parents=True)
        (self.run / "openings" / f"{self.DIGEST}.opening").write_bytes(bytes(range(250)) * 4)
        self.cache: dict[str, list[set[Any]]] = {}

    def client(self, **kw) -> TestClient:
        from miner.prover import create_app as prover_app

        return TestClient(prover_app(self.run, **kw))

    def observe(self, claim: Claim) -> list[set[Any]]:
        if claim.name not in self.cache:
            self.cache[claim.name] = claim.observe(self)
        return self.cache[claim.name]


def obs_prover_range(env: Prover) -> list[set[Any]]:
    url = f"/openings/{env.DIGEST}"
    with env.client() as c:
        partial, whole = set(), c.get(url)
        for rng in ("bytes=0-9", "bytes=990-", "bytes=-10"):
            r = c.get(url, headers={"Range": rng})
            ok = r.headers.get("content-range", "").startswith("bytes ") and len(r.content) == 10
            partial.add(
                r.status_code if ok else f"{r.status_code} without its Content-Range and 10 bytes ({rng})"
            )
        unsat = {c.get(url, headers={"Range": rng}).status_code for rng in ("bytes=1000-", "bytes=5000-6000")}
    if whole.status_code != 200 or len(whole.content) != 1000:
        partial.add(f"the whole opening answered {whole.status_code}")
    with env.client(max_bytes=999) as c:
        over = {c.get(url).status_code, c.get(url, headers={"Range": "bytes=0-9"}).status_code}
    return [partial, unsat, over]


def obs_prover_admin(env: Prover) -> list[set[Any]]:
    with env.client() as c:
        got = {c.get("/admin/store").status_code,
               c.get("/admin/store", headers={"Authorization": "Bearer anything"}).status_code}
        if c.get(f"/openings/{env.DIGEST}").status_code != 200:
            got.add("the opening is not public")
    return [got]


MINER_CLAIMS = [
    Claim(
        "prover ranges",
        r"single `Range: bytes=` requests answer (\d{3}) with `Content-Range` \((\d{3}) when "
        r"unsatisfiable\); files over the size limit answer (\d{3})",
        obs_prover_range,
    ),
    Claim("prover admin", r"Without `--token` the admin routes answer (\d{3})", obs_prover_admin),
]


# --- config defaults and keys ------------------------------------------------------------------

SECTIONS = {name: f.annotation for name, f in NodeConfig.model_fields.items()}
DEFAULTS = NodeConfig()


def field_of(key: str, text: str, pos: int) -> tuple[str, str] | None:
    """(section, key) that a key reference at `pos` names: `section.key`, `[section] key`, or a bare
    key of the `[section]` the text last named before it (a bullet's subject), else the only section
    that has such a key."""
    m = re.fullmatch(r"(?:\[(\w+)\] |(\w+)\.)?(\w+)", key)
    if m is None:
        return None
    sec, name = m.group(1) or m.group(2), m.group(3)
    if sec is not None:
        return (sec, name) if sec in SECTIONS and name in SECTIONS[sec].model_fields else None
    before = re.findall(r"`\[(\w+)\]", text[:pos])
    if before and before[-1] in SECTIONS and name in SECTIONS[before[-1]].model_fields:
        return before[-1], name
    owners = [s for s, model in SECTIONS.items() if name in model.model_fields]
    return (owners[0], name) if len(owners) == 1 else None


UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "s": 1}


def stated_value(raw: str) -> Any:
    """A value as a doc states it: a TOML literal, a bare word or address, or a number with a unit."""
    raw = raw.strip().strip("`").strip()
    m = re.fullmatch(r"([\d.]+) ?(KiB|MiB|GiB|s)", raw)
    if m:
        return float(m.group(1)) * UNITS[m.group(2)]
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def effective_default(sec: str, key: str) -> Any:
    """The default as the node uses it (an empty openings_dir is data_dir/openings)."""
    if (sec, key) == ("node", "openings_dir"):
        return DEFAULTS.openings_dir.as_posix().replace(DEFAULTS.node.data_dir, "data_dir", 1)
    return getattr(getattr(DEFAULTS, sec), key)


def same(stated: Any, actual: Any) -> bool:
    if isinstance(stated, (int, float)) and not isinstance(stated, bool) and isinstance(actual, (int, float)):
        return float(stated) == float(actual)
    return stated == actual


# `key` (default V): V up to the first ; or ) or `, env`.
DEFAULT_PAREN = re.compile(r"`((?:\[\w+\] )?[\w.]+)` \(default:? ((?:(?!, env)[^;)])+)")
DEFAULT_SPAN = re.compile(r"the default `(\w+) = ([^`]+)`")
# `V` (the default), said of the `[section] key` that the same sentence names before it.
THE_DEFAULT = re.compile(r"`(\[\w+\] \w+)`:[^.`]*(?:`[^`]*`[^.`]*)*?: `([^`]+)` \(the default\)")
# Every statement of a default, which some extractor (config above, or a CLI claim) must account for.
DEFAULT_MENTION = re.compile(r"\(default\b|\(the default\)|the default `|, default `|, default \d")


def config_default_problems(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Each `key (default V)`, `the default key = value` and `[section] key: V (the default)` of
    the doc against node.config's models; also returns the spans it read."""
    body = flat(without_fences(text))
    problems, spans = [], []
    found = [(m, m.group(1), m.group(2)) for m in DEFAULT_PAREN.finditer(body)]
    found += [(m, m.group(1), m.group(2)) for m in DEFAULT_SPAN.finditer(body)]
    found += [(m, m.group(1), m.group(2)) for m in THE_DEFAULT.finditer(body)]
    for m, key, raw in found:
        where = field_of(key, body, m.start())
        if where is None:
            problems.append(
                f"{m.group(0)!r}: {key} is no key of node.config (a default of something else needs "
                f"a claim of its own)"
            )
            continue
        spans.append(m.span())
        stated, actual = stated_value(raw), effective_default(*where)
        if not same(stated, actual):
            problems.append(
                f"{m.group(0)!r}: the doc states {where[0]}.{where[1]} defaults to {stated!r}; node.config "
                f"has {actual!r}"
            )
    return problems, spans


def config_key_problems(text: str) -> list[str]:
    """Every `key = value` span and TOML snippet names keys node.config has, with values it accepts;
    every POT_<SECTION>_<KEY> names a key of that section (a stated value applies through load_config)."""
    body = without_fences(text)
    problems = []
    for pos, span in code_spans(text):
        m = re.fullmatch(r"((?:\[\w+\] |\w+\.)?\w+) = (.+)", span)
        if not m or "<" in m.group(2):  # a placeholder is no value
            continue
        try:
            value = tomllib.loads(f"v = {m.group(2)}")["v"]
        except tomllib.TOMLDecodeError:
            continue  # a formula (`value_hash = BLAKE3(...)`), not a setting
        where = field_of(m.group(1), body, pos)
        if where is None:
            problems.append(f"`{span}` (near {_context(body, pos)!r}): {m.group(1)} is no key of node.config")
        else:
            try:
                SECTIONS[where[0]].model_validate({where[1]: value})
            except Exception as exc:  # a pydantic ValidationError or a TOML error: the doc's value is refused
                problems.append(
                    f"`{span}`: node.config refuses it for {where[0]}.{where[1]}: {str(exc)[:200]}"
                )
    for lang, block in fenced_blocks(text):
        if lang != "toml":
            continue
        try:
            data = tomllib.loads(block)
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"a TOML snippet does not parse: {exc}")
            continue
        if not set(data) <= set(SECTIONS):
            continue  # a spec file, not a node config
        try:
            NodeConfig.model_validate(data)
        except Exception as exc:  # a pydantic ValidationError: a key or value node.config refuses
            problems.append(
                f"the TOML snippet {block.strip()[:80]!r} is no valid node config: {str(exc)[:300]}"
            )
    for m in re.finditer(r"\bPOT_([A-Z]+)_([A-Z0-9_]+)(?:=(\S+?))?`", text):
        sec, key = m.group(1).lower(), m.group(2).lower()
        if sec == "key":  # the secrets file's keys
            from node.config import Secrets

            if key not in Secrets.model_fields:
                problems.append(f"{m.group(0).rstrip('`')}: the secrets have no key {key}")
            continue
        if sec not in SECTIONS:
            continue  # POT_PROVER_TOKEN, POT_EXACT_GEMM, ...: not a config key
        if key not in SECTIONS[sec].model_fields:
            problems.append(f"{m.group(0).rstrip('`')}: node.config has no key {sec}.{key}")
        elif m.group(3) is not None:
            try:
                got = getattr(
                    getattr(load_config(None, env={m.group(0).split('=')[0]: m.group(3)}), sec), key
                )
            except ConfigError as exc:
                got = f"a config error: {exc}"
            if not same(stated_value(m.group(3)), got):
                problems.append(f"{m.group(0).rstrip('`')} gives {sec}.{key} = {got!r}")
    return problems


def example_config_problems(text: str) -> list[str]:
    """examples/node.toml holds every key of every section at its default, each with its
    environment variable named in the comment above it."""
    problems = []
    data = tomllib.loads(text)
    for sec, model in SECTIONS.items():
        given = data.get(sec)
        if given is None:
            problems.append(f"[{sec}] is missing")
            continue
        for key in model.model_fields:
            if key not in given:
                problems.append(f"[{sec}] {key} is missing")
            elif not same(given[key], getattr(getattr(DEFAULTS, sec), key)):
                problems.append(f"[{sec}] {key} = {given[key]!r}, but its default is "
                                f"{getattr(getattr(DEFAULTS, sec), key)!r}")
        for key in set(given) - set(model.model_fields):
            problems.append(f"[{sec}] {key} is no key of node.config")
    for key in set(data) - set(SECTIONS):
        problems.append(f"[{key}] is no section of node.config")
    # The comment lines above each key name its POT_<SECTION>_<KEY>.
    sec, comments = "", []
    for line in text.splitlines():
        if m := re.match(r"\[(\w+)\]", line):
            sec, comments = m.group(1), []
        elif line.startswith("#"):
            comments.append(line)
        elif m := re.match(r"(\w+) =", line):
            env = f"POT_{sec}_{m.group(1)}".upper()
            if not any(re.search(rf"\b{env}\b", c) for c in comments):
                problems.append(f"[{sec}] {m.group(1)}: the comment above it does not name {env}")
            comments = []
    return problems


# --- the CLI -----------------------------------------------------------------------------------


def cli_root():
    from pot.cli import app

    return typer.main.get_command(app)


def _options(cmd) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        names.update(p.opts)
        names.update(getattr(p, "secondary_opts", []))
    return names


def invocations(text: str) -> list[tuple[str, list[str]]]:
    """(where, tokens after `pot`) of every `pot ...` the doc writes: inline code spans and the lines
    of its shell blocks (continuations joined, `-m pot -- ...` included). A shell operator or a
    comment ends the command."""
    found = []
    for pos, span in code_spans(text):
        m = re.match(r"(?:\$ )?(?:\.venv/bin/)?pot (.*)", span)
        if m:
            found.append((_context(text, pos), m.group(1).split()))
    for lang, block in fenced_blocks(text):
        if lang not in ("", "sh", "bash", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            for m in re.finditer(
                r"(?:^|&&|;|\|)\s*(?:\$ )?(?:\.venv/bin/)?pot (.*)|-m pot -- (.*)", line.strip()
            ):
                found.append((line.strip()[:100], (m.group(1) or m.group(2)).split()))
    out = []
    for where, tokens in found:
        kept = []
        for t in tokens:
            if t in ("&", "&&", "|", ";", ">", "2>") or t.startswith("#"):
                break
            kept.append(t)
        out.append((where, kept))
    return out


def resolve(tokens: list[str]) -> tuple[Any, list[str], list[str]]:
    """(command, its path, the rest) for tokens after `pot`."""
    cmd, path = cli_root(), []
    rest = list(tokens)
    while rest and getattr(cmd, "commands", None):
        word = rest[0].strip("`'.,:;()").removesuffix("'s")
        if word not in cmd.commands:
            break
        cmd, path = cmd.commands[word], [*path, word]
        rest.pop(0)
    return cmd, path, rest


def cli_problems(text: str) -> list[str]:
    """Every `pot ...` command of the doc exists and takes the options written after it; an option
    span written alone (`--mirror URL`) is an option of some command the doc names."""
    problems, named = [], []
    for where, tokens in invocations(text):
        cmd, path, rest = resolve(tokens)
        if not path:
            problems.append(
                f"`pot {' '.join(tokens)}` ({where!r}): pot has no command {tokens[0] if tokens else ''!r}"
            )
            continue
        named.append(cmd)
        word = rest[0].strip("`'.,:;()") if rest else ""
        if getattr(cmd, "commands", None) and re.fullmatch(r"[a-z][a-z-]*", word) and not word.isupper():
            problems.append(
                f"`pot {' '.join(tokens)}` ({where!r}): `pot {' '.join(path)}` has no command {word!r} "
                f"(it has {', '.join(sorted(cmd.commands))})"
            )
        for t in rest:
            t = t.strip("[]`'.,;()")
            for opt in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", t):
                if t.startswith("-") and opt not in _options(cmd):
                    problems.append(
                        f"`pot {' '.join(tokens)}` ({where!r}): `pot {' '.join(path)}` has no option {opt}"
                    )
    every = set().union(*(_options(c) for c in named)) if named else set()
    for pos, span in code_spans(text):
        if re.match(r"--[a-z]", span):
            for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span):
                if opt not in every:
                    problems.append(
                        f"`{span}` (near {_context(text, pos)!r}): no `pot` command the doc names takes {opt}"
                    )
    return problems


@dataclass(frozen=True)
class CliClaim:
    """A stated CLI default: `pattern` finds it in the doc (flattened), group 1 is the value, and
    `check` returns the problems of that value against the real command."""

    name: str
    pattern: str
    check: Callable[[str, Path], list[str]]


def check_timeout_default(value: str, _tmp: Path) -> list[str]:
    root, problems, seen = cli_root(), [], 0
    for noun in ("node", "chain"):
        for name, cmd in root.commands[noun].commands.items():
            for p in cmd.params:
                if "--timeout" in p.opts:
                    seen += 1
                    if not same(float(value), p.default):
                        problems.append(
                            f"pot {noun} {name} --timeout defaults to {p.default}, the doc says {value}"
                        )
    return problems + ([] if seen else ["no command of pot node or pot chain takes --timeout"])


def check_dev_authority_default(value: str, tmp: Path) -> list[str]:
    from chain.dev import DevTransport
    from pot.cli import app

    db = tmp / "chain.db"
    result = CliRunner().invoke(app, ["chain", "dev", "--db", str(db)])
    if result.exit_code != 0:
        return [f"pot chain dev --db FILE failed: {result.output}"]
    t = DevTransport(db, "observer")
    try:
        got = t.network_authority()
    finally:
        t.close()
    return (
        [] if got == value else [f"pot chain dev without --authority records {got!r}, the doc says {value!r}"]
    )


def check_mirrors(value: str, _tmp: Path) -> list[str]:
    from chain.calls import MAX_MIRRORS

    opt = next(p for p in cli_root().commands["miner"].commands["train"].params if "--mirror" in p.opts)
    problems = [] if opt.multiple else ["pot miner train --mirror cannot be repeated"]
    return problems + (
        [] if int(value) == MAX_MIRRORS else [f"an opening carries at most {MAX_MIRRORS} mirrors"]
    )


def check_root_every(_value: str, _tmp: Path) -> list[str]:
    # No fixed number: the option's default is None, which the trainer turns into a quarter of the run.
    opt = next(p for p in cli_root().commands["miner"].commands["train"].params if "--root-every" in p.opts)
    return [] if opt.default is None else [f"pot miner train --root-every defaults to {opt.default}"]


def check_keep_every(value: str, _tmp: Path) -> list[str]:
    params = cli_root().commands["miner"].commands["train"].params
    keep = next(p for p in params if "--keep-every" in p.opts)
    adapt = next(p for p in params if "--adapt-keep-every" in p.opts)
    problems = (
        [] if keep.default == int(value) else [f"pot miner train --keep-every defaults to {keep.default}"]
    )
    return problems + (
        [] if adapt.default is True else ["pot miner train --adapt-keep-every is off by default"]
    )


def check_limit(value: str, tmp: Path) -> list[str]:
    lo, hi, default = map(int, re.fullmatch(r"(\d+)\.\.(\d+) \(default (\d+)\)", value).groups())
    eng = open_database(f"sqlite:///{tmp / 'limit.db'}", init=True)
    try:
        schema = create_app(eng, NodeConfig()).openapi()
    finally:
        eng.dispose()
    problems, seen = [], 0
    for path, ops in schema["paths"].items():
        for param in ops.get("get", {}).get("parameters", []):
            if param["name"] == "limit":
                seen += 1
                got = param["schema"]
                if (got.get("minimum"), got.get("maximum"), got.get("default")) != (lo, hi, default):
                    problems.append(
                        f"GET {path} takes limit {got.get('minimum')}..{got.get('maximum')} (default "
                        f"{got.get('default')}), the doc says {value}"
                    )
    return problems + ([] if seen >= 2 else ["no list route takes a limit"])


def check_allowed_hosts(value: str, _tmp: Path) -> list[str]:
    from node.config import HttpSection, normalize_host

    stated = set(re.findall(r"`([^`]+)`", value))
    problems = []
    for listen in ("127.0.0.1:8700", "10.0.0.5:8700", "[fd00::5]:8700"):
        got = HttpSection(listen=listen).host_names()
        want = stated | {normalize_host(listen.rpartition(":")[0])}  # the listen address's host
        if got != want:
            problems.append(f"with listen {listen} the Host names are {sorted(got or [])}, the doc says "
                            f"{sorted(want)}")
    if HttpSection(allowed_hosts=["*"]).host_names() is not None:
        problems.append('["*"] does not turn the Host check off')
    if HttpSection(allowed_hosts=["pot.example.org"]).host_names() != {"pot.example.org"}:
        problems.append("a configured list does not replace the default")
    return problems


def check_env_list(value: str, _tmp: Path) -> list[str]:
    env, text = re.fullmatch(r"`(POT_\w+)`, (comma)-separated", value).groups()
    sec, key = env.lower().split("_", 2)[1:]
    if sec not in SECTIONS or key not in SECTIONS[sec].model_fields:
        return [f"{env} names no key of node.config"]
    got = getattr(getattr(load_config(None, env={env: "127.0.0.1, 10.1.0.0/16,prover.lan"}), sec), key)
    return [] if got == ["127.0.0.1", "10.1.0.0/16", "prover.lan"] else [f"{env} with commas gives {got!r}"]


def check_prover_token_env(value: str, _tmp: Path) -> list[str]:
    problems = []
    for name in ("serve", "train"):
        opt = next(p for p in cli_root().commands["miner"].commands[name].params if "--token" in p.opts)
        if opt.envvar != value:
            problems.append(f"pot miner {name} --token reads {opt.envvar!r}, the doc says {value}")
    return problems


HOSTS_DEFAULT = r"default the listen address's host, (`[^`]+`, `[^`]+` and `[^`]+`)"
API_STATED = [CliClaim("list limit", r"`limit` is (\d+\.\.\d+ \(default \d+\))", check_limit),
              CliClaim("allowed hosts", HOSTS_DEFAULT, check_allowed_hosts)]
OPERATOR_CLI = [
    CliClaim(
        "allow from the environment", r"\(env (`POT_\w+`, comma-separated)\) opens exceptions", check_env_list
    ),
    CliClaim("allowed hosts", HOSTS_DEFAULT, check_allowed_hosts),
    CliClaim(
        "node and chain --timeout",
        r"\(`--timeout`, default (\d+) s for the node's and the chain's commands\)",
        check_timeout_default,
    ),
    CliClaim(
        "dev chain authority",
        r"`pot chain dev --db \S+ --authority NAME`, default `(\w+)`",
        check_dev_authority_default,
    ),
]
MINER_CLI = [
    CliClaim("prover token env", r"`--token` \(or `(POT_\w+)`\) guards", check_prover_token_env),
    CliClaim("mirrors", r"`--mirror URL` \(repeatable, at most (\d+)\)", check_mirrors),
    CliClaim("root every", r"`--root-every` steps \((default: a quarter of the run)\)", check_root_every),
    CliClaim("keep every", r"`--keep-every K` \(default (\d+)\)", check_keep_every),
]


def cli_default_problems(
    text: str, claims: list[CliClaim], tmp: Path
) -> tuple[list[str], list[tuple[int, int]]]:
    body = flat(without_fences(text))
    problems, spans = [], []
    for c in claims:
        m = re.search(c.pattern, body)
        if m is None:
            problems.append(
                f"{c.name}: the doc no longer has the sentence /{c.pattern}/; update the claim with it"
            )
            continue
        spans.append(m.span())
        problems += [f"{c.name}: {p}" for p in c.check(m.group(1), tmp)]
    return problems, spans


def default_coverage_problems(text: str, spans: list[tuple[int, int]]) -> list[str]:
    body = flat(without_fences(text))
    return [f"the default stated at {_context(body, m.start())!r} is checked by nothing"
            for m in DEFAULT_MENTION.finditer(body) if not any(a <= m.start() < b for a, b in spans)]


def defaults_problems(text: str, cli_claims: list[CliClaim], tmp: Path) -> list[str]:
    config, spans = config_default_problems(text)
    cli, more = cli_default_problems(text, cli_claims, tmp)
    return config + cli + default_coverage_problems(text, spans + more)


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_app(tmp_path_factory):
    eng = open_database(f"sqlite:///{tmp_path_factory.mktemp('docs-app') / 'node.db'}", init=True)
    yield create_app(eng, NodeConfig())
    eng.dispose()


@pytest.fixture(scope="module")
def prover(tmp_path_factory):
    return Prover(tmp_path_factory.mktemp("docs-prover"))


@pytest.fixture(scope="module")
def api_env(tmp_path_factory):
    env = NodeApi(tmp_path_factory.mktemp("docs-api"))
    yield env
    env.close()


def test_api_md_routes_are_the_apps(node_app):
    assert route_problems(read_doc("api.md"), node_app) == []


def test_miner_md_prover_routes_are_the_provers(prover):
    with prover.client() as c:
        assert route_problems(section(read_doc("miner.md"), "The prover server"), c.app) == []


@pytest.mark.parametrize(
    ("old", "new", "finds"),
    [
        ("`GET /api/v1/stake`", "`GET /api/v1/stakes`", "no such route"),
        (
            "`POST /api/v1/admin/witness-conflicts/acknowledge`",
            "`GET /api/v1/admin/witness-conflicts/acknowledge`",
            "no such route (it has POST",
        ),
        (
            "`GET /api/v1/refusals?origin=&limit=`",
            "`GET /api/v1/refusals?origin=&limit=&cursor=`",
            "query parameters",
        ),
        ("/api/v1/refusals", "/api/v1/refused", "GET /api/v1/refusals, which the doc never"),
        ("`/redoc`", "`the other page`", "GET /redoc, which the doc never"),
        ("`/static/live.js`", "`live.js`", "files under /static/"),
    ],
)
def test_the_route_check_finds_a_planted_mismatch(node_app, old, new, finds):
    text = read_doc("api.md")
    assert old in text
    problems = route_problems(text.replace(old, new), node_app)  # every occurrence
    assert any(finds in p for p in problems), problems


def _planted(text: str, claims: list[Claim]) -> list[tuple[str, str]]:
    """(claim and group, the doc with that group's stated code changed) for every stated code."""
    body = flat(without_fences(text))
    out = []
    for c in claims:
        m = re.search(c.pattern, body)
        assert m, c.name
        for i in range(1, len(m.groups()) + 1):
            stated = m.group(i)
            wrong = (
                ("3xx" if stated[0] != "3" else "5xx")
                if stated.endswith("xx")
                else ("418" if stated != "418" else "419")
            )
            out.append((f"{c.name} #{i}", body[:m.start(i)] + wrong + body[m.end(i):]))
    return out


def test_api_md_status_codes_are_what_the_app_answers(api_env):
    assert status_problems(read_doc("api.md"), API_CLAIMS, api_env.observe) == []


def test_operator_md_status_codes_are_what_the_app_answers(api_env):
    text = read_doc("operator.md")
    problems = status_problems(section(text, "Install and configure"), OPERATOR_CLAIMS, api_env.observe)
    assert problems == []


def test_miner_md_prover_status_codes_are_what_the_prover_answers(prover):
    assert (
        status_problems(section(read_doc("miner.md"), "The prover server"), MINER_CLAIMS, prover.observe)
        == []
    )


def test_the_status_check_finds_every_planted_code(api_env, prover):
    cases = [(t, API_CLAIMS, api_env) for t in _planted(read_doc("api.md"), API_CLAIMS)]
    cases += [(t, MINER_CLAIMS, prover) for t in _planted(section(read_doc("miner.md"), "The prover server"),
                                                           MINER_CLAIMS)]
    assert len(cases) >= 25
    for (what, text), claims, env in cases:
        problems = status_problems(text, claims, env.observe)
        assert any(p.startswith(what.split(" #")[0] + ":") for p in problems), (
            f"a wrong code in {what} went unnoticed"
        )
    # A code the doc states where no claim looks, and a claim whose sentence is gone.
    text = read_doc("api.md").replace("### Pagination", "A run that is gone answers 410.\n\n### Pagination")
    assert any("status 410" in p for p in status_problems(text, API_CLAIMS, api_env.observe))
    text = read_doc("api.md").replace("Otherwise 409 with the reason", "Otherwise an error with the reason")
    assert any(
        "retry conflict: the doc no longer" in p for p in status_problems(text, API_CLAIMS, api_env.observe)
    )


def test_readyz_reports_its_checks_over_a_database_without_the_nodes_tables(tmp_path):
    # Reachable, but never initialised: the database check fails, and so must the others, with a
    # reason, rather than /readyz answering a bare 503 from the error handler.
    eng = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with TestClient(create_app(eng, NodeConfig()), base_url=BASE) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False, r.text
        checks = r.json()["checks"]
        assert set(checks) == {"database", "chain_head", "worker_pool", "determinism"}
        assert checks["database"]["ok"] is False and "this node needs" in checks["database"]["detail"]
        assert checks["chain_head"]["ok"] is False and "cannot be read" in checks["chain_head"]["detail"]
        assert c.get("/metrics").status_code == 200
    eng.dispose()


def test_the_observations_are_the_apps_answers(api_env):
    # What the claims are compared with: each case's real status, not the doc's number.
    assert api_env.observe(API_CLAIMS[0]) == [{200}, {503}]
    assert obs_admin(api_env) == [{401}, {403}, {403}]


@pytest.mark.parametrize("doc", ["api.md", "operator.md", "miner.md"])
def test_stated_config_defaults_and_keys_are_node_configs(doc, tmp_path):
    text = read_doc(doc)
    claims = {"operator.md": OPERATOR_CLI, "miner.md": MINER_CLI, "api.md": API_STATED}[doc]
    assert defaults_problems(text, claims, tmp_path) == []
    if doc != "miner.md":  # miner.md's `key = value` spans are spec fields and call fields
        assert config_key_problems(text) == []


def test_operator_md_states_the_defaults_it_is_checked_for():
    _, spans = config_default_problems(read_doc("operator.md"))
    assert len(spans) >= 7  # listen, openings_miner_share, replay.timeout_s, max_opening_bytes, ...


@pytest.mark.parametrize(
    ("doc", "old", "new", "finds"),
    [
        (
            "operator.md",
            "`listen` (default `127.0.0.1:8700`)",
            "`listen` (default `0.0.0.0:8700`)",
            "http.listen",
        ),
        (
            "operator.md",
            "`openings_miner_share` (default 0.5)",
            "`openings_miner_share` (default 0.25)",
            "node.openings_miner_share",
        ),
        ("operator.md", "(default 4 GiB)", "(default 2 GiB)", "fetch.max_opening_bytes"),
        (
            "operator.md",
            "`replay.timeout_s` (default 1800)",
            "`replay.timeout_s` (default 600)",
            "replay.timeout_s",
        ),
        ("operator.md", '`"auto"` (the default)', "`0` (the default)", "verifier.bond"),
        ("operator.md", 'the default `backend = "local"`', 'the default `backend = "ray"`', "replay.backend"),
        ("operator.md", "(default `data_dir/openings`;", "(default `data_dir`;", "node.openings_dir"),
        ("api.md", "(default `127.0.0.1:8700`, env", "(default `127.0.0.1:8701`, env", "http.listen"),
        ("api.md", "`localhost` and `[::1]`;", "`localhost` and `[::2]`;", "the doc says"),
        (
            "operator.md",
            "`127.0.0.1`, `localhost` and `[::1]`; any",
            "`127.0.0.1`, `0.0.0.0` and `[::1]`; any",
            "the doc says",
        ),
        (
            "api.md",
            "`limit` is 1..500 (default 50)",
            "`limit` is 1..100 (default 50)",
            "the doc says 1..100 (default 50)",
        ),
        ("operator.md", "`--timeout`, default\n  120 s", "`--timeout`, default\n  60 s", "defaults to 120.0"),
        ("operator.md", "default `alice`;", "default `bob`;", "records 'alice'"),
        ("miner.md", "(or `POT_PROVER_TOKEN`)", "(or `POT_MINER_TOKEN`)", "reads 'POT_PROVER_TOKEN'"),
        (
            "operator.md",
            "`POT_FETCH_ALLOW`, comma-separated",
            "`POT_FETCH_ALLOWED`, comma-separated",
            "names no key",
        ),
        ("miner.md", "(repeatable, at most 4)", "(repeatable, at most 8)", "at most 4 mirrors"),
        (
            "operator.md",
            "`schedule.stage_threads` bounds",
            "`schedule.stage_threads` (default 8) bounds",
            "schedule.stage_threads defaults to 8",
        ),
        (
            "operator.md",
            "## First start",
            "A witness is kept (default 3 days).\n\n## First start",
            "checked by nothing",
        ),
    ],
)
def test_the_default_check_finds_a_planted_mismatch(doc, old, new, finds, tmp_path):
    text = read_doc(doc)
    assert old in text, old
    claims = {"operator.md": OPERATOR_CLI, "miner.md": MINER_CLI, "api.md": API_STATED}[doc]
    problems = defaults_problems(text.replace(old, new), claims, tmp_path)
    assert any(finds in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "finds"), [
    ("`allow = [\"127.0.0.1\"]`", "`allow_list = [\"127.0.0.1\"]`", "allow_list is no key"),
    ("`fetch.allow_broad = true`", "`fetch.allow_broad = 3`", "refuses it for fetch.allow_broad"),
    ("`POT_REPLAY_WORKERS=4`", "`POT_REPLAY_THREADS=4`", "no key replay.threads"),
    ("`POT_REPLAY_WORKERS=4`", "`POT_REPLAY_WORKERS=x`", "POT_REPLAY_WORKERS=x"),
    ("`POT_KEY_MNEMONIC`", "`POT_KEY_SEED`", "the secrets have no key seed"),
    ("max_retries = 3\n```", "max_retry = 3\n```", "no valid node config"),
])
def test_the_key_check_finds_a_planted_mismatch(old, new, finds):
    text = read_doc("operator.md")
    assert old in text, old
    problems = config_key_problems(text.replace(old, new))
    assert any(finds in p for p in problems), problems


def test_example_config_holds_every_key_at_its_default():
    assert example_config_problems(EXAMPLE_CONFIG.read_text()) == []


@pytest.mark.parametrize(("old", "new", "finds"), [
    ("\nworkers = 1\n", "\nworkers = 2\n", "[replay] workers = 2, but its default is 1"),
    ("\nresend_after_blocks = 3\n", "\n", "[chain] resend_after_blocks is missing"),
    ("POT_FETCH_ATTEMPTS", "POT_FETCH_TRIES", "does not name POT_FETCH_ATTEMPTS"),
    ("\nquorum_share = [1, 2]\n", "\nquorum_share = [1, 3]\n", "quorum_share"),
])
def test_the_example_check_finds_a_planted_mismatch(old, new, finds):
    text = EXAMPLE_CONFIG.read_text()
    assert old in text
    problems = example_config_problems(text.replace(old, new, 1))
    assert any(finds in p for p in problems), problems


@pytest.mark.parametrize("doc", ["api.md", "operator.md", "miner.md"])
def test_every_pot_command_and_option_of_the_docs_exists(doc):
    text = read_doc(doc)
    assert len(invocations(text)) >= (1 if doc == "api.md" else 10)
    assert cli_problems(text) == []


@pytest.mark.parametrize(("doc", "old", "new", "finds"), [
    ("operator.md", "pot node init --config", "pot node initialise --config", "has no command 'initialise'"),
    ("operator.md", "pot node run --config node.toml --init", "pot node run --config node.toml --initdb",
     "no option --initdb"),
    ("miner.md", "--mirror URL` (repeatable", "--mirrors URL` (repeatable", "takes --mirrors"),
    ("miner.md", "pot spec show --canonical FILE", "pot spec print --canonical FILE", "no command 'print'"),
    ("miner.md", "-m pot -- miner train --spec", "-m pot -- miner train --specs", "no option --specs"),
    ("operator.md", "`pot chain events`", "`pot chains events`", "pot has no command 'chains'"),
    ("api.md", "`pot node run` serves", "`pot node serve` serves", "no command 'serve'"),
    ("miner.md", "[--host --port --token]", "[--host --port --secret]", "has no option --secret"),
])
def test_the_cli_check_finds_a_planted_mismatch(doc, old, new, finds):
    text = read_doc(doc)
    assert old in text, old
    problems = cli_problems(text.replace(old, new))
    assert any(finds in p for p in problems), problems


def test_the_checkers_read_what_they_should():
    # The extractors see the facts at all: a checker that reads nothing passes everything.
    api = read_doc("api.md")
    assert sum(bool(ROUTE_SPAN.match(s)) for _, s in code_spans(api)) >= 12
    body = flat(without_fences(api))
    assert len(list(MENTION.finditer(body))) >= 15
    assert {"421", "400", "422", "404", "503", "401", "403", "409"} <= {
        m.group(1) for m in MENTION.finditer(body)
    }
    assert not MENTION.search("127.0.0.1:8700, 1..500, 10,000 records, mode 600, 4096")


def probe_table_problems(text: str, probes: list[Any]) -> list[str]:
    """The table of docs/redteam.md's "Hostile input" lists every probe `pot redteam` runs, with its kind."""
    rows = {}
    for line in section(text, "Hostile input").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)+", cells[0]):
            rows[cells[0]] = cells[1]
    problems = [f"the probe {p.name} is not in the table" for p in probes if p.name not in rows]
    problems += [
        f"the table's {name} is no probe of pot redteam"
        for name in rows
        if name not in {p.name for p in probes}
    ]
    problems += [f"{p.name}: the table says kind {rows[p.name]!r}, the probe {p.kind!r}" for p in probes
                 if p.name in rows and rows[p.name] != p.kind]
    return problems


def test_redteam_md_lists_every_hostile_input_probe():
    from devnet.redteam import PROBES

    text = read_doc("redteam.md")
    assert len(PROBES) >= 20
    assert probe_table_problems(text, PROBES) == []
    planted = text.replace(
        "| poison-manifest | a poison manifest |", "| poison-manifest | a hostile remark |"
    )
    assert probe_table_problems(planted, PROBES) == [
        "poison-manifest: the table says kind 'a hostile remark', the probe 'a poison manifest'"
    ]
    gone = text.replace("| slowloris-prover |", "| slow-prover |")
    assert set(probe_table_problems(gone, PROBES)) == {"the probe slowloris-prover is not in the table",
                                                       "the table's slow-prover is no probe of pot redteam"}


def metrics_problems(text: str, exposition: str) -> list[str]:
    """The metrics table of docs/api.md against the app's /metrics: the same names, each of the
    stated type, with the stated labels (where the exposition has a sample). A row whose type says
    `in the daemon's process` may be absent from an app served without the daemon."""
    rows = {}
    for m in re.finditer(r"^\| `(pot_\w+)` \| ([^|]*)\| ([^|]*)\|", section(text, "Metrics"), re.M):
        labels = {lab for lab in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", m.group(3)))}
        rows[m.group(1)] = (m.group(2).strip(), labels)
    types = dict(re.findall(r"^# TYPE (pot_\w+) (\w+)", exposition, re.M))
    types = {n: t for n, t in types.items() if not n.endswith("_created")}  # prometheus_client's own series
    problems = []
    for name, (typ, labels) in rows.items():
        if name not in types:
            if "in the daemon's process" not in typ:
                problems.append(f"{name} is in the table but not in /metrics")
            continue
        if not typ.startswith(types[name]):
            problems.append(f"{name}: the table says {typ.split(':')[0]!r}, /metrics says {types[name]}")
        sample = re.search(rf"^{name}(?:_total|_count|_bucket)?\{{([^}}]*)\}}", exposition, re.M)
        if sample:
            got = {kv.split("=")[0] for kv in sample.group(1).split(",")} - {"le", "quantile"}
            if got != labels:
                problems.append(
                    f"{name}: the table lists labels {sorted(labels)}, /metrics has {sorted(got)}"
                )
    problems += [f"{name} is in /metrics but not in the table" for name in types if name not in rows]
    return problems


def test_api_md_metrics_table_is_the_apps_metrics(api_env):
    eng, _ = api_env.engine()
    with api_env.client(eng) as c:
        c.get("/api/v1/status")
        exposition = c.get("/metrics").text
    text = read_doc("api.md")
    assert metrics_problems(text, exposition) == []
    for old, new, finds in [
        ("| `pot_runs` | gauge |", "| `pot_runs` | counter |", "pot_runs: the table says"),
        ("| `pot_txs` | gauge | `state` |", "| `pot_txs` | gauge | `status` |", "labels"),
        ("| `pot_runs` | gauge |", "| `pot_run_count` | gauge |", "pot_runs is in /metrics"),
    ]:
        assert old in text, old
        assert any(finds in p for p in metrics_problems(text.replace(old, new), exposition)), (old, new)


def filter_problems(text: str, app: Any) -> list[str]:
    """The values docs/api.md lists for the challenge list's `status` and `stage` filters are the
    schema's, and its readiness table names the checks /readyz makes."""
    body = flat(without_fences(text))
    params = {p["name"]: p for p in app.openapi()["paths"]["/api/v1/challenges"]["get"]["parameters"]}
    problems = []
    for name, pattern in (("status", r"`status` is the chain's outcome, one of (.*?) \("),
                          ("stage", r"`stage` is where this node's job is: (.*?);")):
        m = re.search(pattern, body)
        if m is None:
            problems.append(f"the doc no longer lists the values of {name}")
            continue
        stated = set(re.findall(r"`(\w+)`", m.group(1)))
        schema = params[name]["schema"]
        enum = set(next(s["enum"] for s in schema.get("anyOf", [schema]) if "enum" in s))
        if stated != enum:
            problems.append(f"the doc lists {name} values {sorted(stated)}; the API takes {sorted(enum)}")
    from node.api import ApiContext, readiness

    stated = set(re.findall(r"^\| `(\w+)` \| ", section(text, "Readiness"), re.M))
    eng = app.state.pot.engine
    checks = set(readiness(ApiContext(eng, NodeConfig())))
    if stated != checks:
        problems.append(f"the readiness table names {sorted(stated)}; /readyz checks {sorted(checks)}")
    return problems


def test_api_md_filters_and_readiness_checks_are_the_apps(node_app):
    text = read_doc("api.md")
    assert filter_problems(text, node_app) == []
    for old, new, finds in [("`revealed`, `done`", "`revealed`, `resolved`, `done`", "stage values"),
                            ("`inconclusive`, `pending` (no", "`inconclusive` (no", "status values"),
                            ("| `worker_pool` |", "| `workers` |", "readiness table")]:
        assert old in text, old
        assert any(finds in p for p in filter_problems(text.replace(old, new), node_app)), (old, new)


def signature_problems(text: str) -> list[str]:
    """Each `node.api.NAME(params)` span of the doc has the function's parameters: their names and
    order, `*` where keyword-only ones begin, and the stated defaults (`...` states none)."""
    import inspect

    import node.api

    problems = []
    for _, span in code_spans(text):
        m = re.fullmatch(r"node\.api\.(\w+)\((.*)\)", span)
        if not m:
            continue
        fn = getattr(node.api, m.group(1), None)
        if fn is None:
            problems.append(f"`{span}`: node.api has no {m.group(1)}")
            continue
        actual, star = [], False
        for p in inspect.signature(fn).parameters.values():
            if p.kind is p.KEYWORD_ONLY and not star:
                actual.append(("*", None))
                star = True
            actual.append((p.name, None if p.default is p.empty else repr(p.default)))
        stated = []
        for part in (x.strip() for x in m.group(2).split(",") if x.strip()):
            name, _, default = part.partition("=")
            stated.append((name, default or None))
        names = [n for n, _ in stated]
        if names != [n for n, _ in actual][: len(names)] or len(names) < len(
            [n for n, d in actual if d is None]
        ):
            problems.append(f"`{span}`: {m.group(1)} takes ({', '.join(n for n, _ in actual)})")
            continue
        for (name, default), (_, real) in zip(stated, actual, strict=False):
            if default not in (None, "...") and default != real:
                problems.append(f"`{span}`: {name} defaults to {real}, not {default}")
    return problems


def test_api_md_function_signatures_are_node_apis():
    text = read_doc("api.md")
    assert "`node.api.create_app(" in text
    assert signature_problems(text) == []
    for old, new in [("create_app(db, config, *, node=None", "create_app(db, config, node=None"),
                     ("admin_token=None)", "admin_token='')"),
                     ("start_api_server(config, engine,", "start_api_server(engine, config,")]:
        assert old in text, old
        assert signature_problems(text.replace(old, new)), (old, new)


def manifest_problems(text: str) -> list[str]:
    """The manifest table of docs/miner.md ("holds exactly") names challenges.opening.FIELDS."""
    from challenges.opening import FIELDS

    table = section(text, "Openings")
    stated = set()
    for m in re.finditer(r"^\| ([^|]+) \| [^|]+ \|$", table, re.M):
        stated.update(re.findall(r"`(\w+)`", m.group(1)))
    problems = [f"the manifest table lacks {f}" for f in FIELDS if f not in stated]
    return problems + [f"the manifest table names {f}, which a manifest does not hold" for f in sorted(stated)
                       if f not in FIELDS]


def test_miner_md_manifest_table_is_the_openings_fields():
    text = read_doc("miner.md")
    assert manifest_problems(text) == []
    assert manifest_problems(text.replace("| `root`, `size` |", "| `root`, `size`, `mirrors` |")) == [
        "the manifest table names mirrors, which a manifest does not hold"]
    assert manifest_problems(text.replace("| `root`, `size` |", "| `root` |")) == [
        "the manifest table lacks size"
    ]
