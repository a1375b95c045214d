"""The deployment files: the compose files validate (with the docker client, when there is one); the
whole network's holds it on standard images, the small stack's builds every image here (deploy/image);
every file they mount exists; the Dockerfile copies every package pyproject.toml installs, installs
from the wheelhouse alone and the postgres extra, and .dockerignore lets each COPY source through;
Prometheus scrapes every verifier; the Grafana dashboard asks only for pot_ metrics that the node
exports. tests/e2e/test_docker_stack.py builds and runs the stack."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
STACK = REPO / "docker-compose.stack.yml"
DOCKERFILE = REPO / "deploy/Dockerfile"
STANDARD_IMAGES = re.compile(r"^(postgres|node|curlimages/curl|prom/prometheus|grafana/grafana):[\w.-]+$")


def compose(path: Path = COMPOSE) -> dict:
    return yaml.safe_load(path.read_text())


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) if the client has it, else `docker-compose`, else None."""
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.parametrize("path", [COMPOSE, STACK], ids=lambda p: p.name)
def test_docker_compose_config_validates(path):
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no docker client with compose here")
    r = subprocess.run([*cmd, "-f", str(path), "config", "-q"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*cmd, "-f", str(path), "config", "--services"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert set(r.stdout.split()) == set(compose(path)["services"])


def test_compose_runs_the_whole_network_on_standard_images():
    services = compose()["services"]
    assert {"postgres", "chopsticks", "miner", "verifier-1", "verifier-2", "verifier-3", "prometheus",
            "grafana"} <= set(services)
    for name, svc in services.items():
        if "build" in svc:
            assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
            assert (REPO / svc["build"]["dockerfile"]).is_file()
        else:
            assert STANDARD_IMAGES.match(svc["image"]), f"{name}: {svc['image']} is not a standard image"
    keys = {services[f"verifier-{i}"]["environment"]["POT_KEY_URI"] for i in (1, 2, 3)}
    dbs = {services[f"verifier-{i}"]["environment"]["POT_DATABASE_URL"].rsplit("/", 1)[1] for i in (1, 2, 3)}
    assert len(keys) == 3 and len(dbs) == 3, "each verifier needs its own key and database"
    init = (REPO / "deploy/postgres/init.sql").read_text()
    assert all(f"CREATE DATABASE {db} " in init for db in dbs)


@pytest.mark.parametrize("path", [COMPOSE, STACK], ids=lambda p: p.name)
def test_every_mounted_file_exists(path):
    mounts = 0
    for name, svc in compose(path)["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("./"):
                mounts += 1
                assert (REPO / src).exists(), f"{name} mounts {src}, which is missing"
    assert mounts


def test_stack_builds_every_image_here():
    """Each service of the small stack runs an image deploy/image builds from Debian packages (no
    registry): pot-verifier from deploy/Dockerfile, pot-postgres from deploy/postgres."""
    services = compose(STACK)["services"]
    assert {"postgres", "chain", "node", "miner"} <= set(services)
    built = {"pot-verifier:latest": "deploy/Dockerfile", "pot-postgres:latest": "deploy/postgres/Dockerfile"}
    for name, svc in services.items():
        assert svc["image"] in built, f"{name}: {svc['image']} is not an image deploy/image builds"
        context = REPO / svc["build"]["context"]
        assert context / svc["build"].get("dockerfile", "Dockerfile") == REPO / built[svc["image"]], name
        assert svc["build"]["args"]["BASE"].startswith("${POT_BASE_IMAGE:-pot-base:")
    script = (REPO / "deploy/image").read_text()
    assert "build pot-verifier:latest -f deploy/Dockerfile " in script
    assert "build pot-postgres:latest --build-arg BASE=\"$tag\" deploy/postgres" in script
    # One config gives the chain its parameters, pins them for the miner and configures the node.
    assert "--params" in services["chain"]["command"]
    assert "--params /etc/pot/node.toml" in (REPO / "deploy/stack/miner.sh").read_text()
    node_toml = tomllib.loads((REPO / "deploy/stack/node.toml").read_text())
    assert node_toml["chain"]["url"] == "dev:///srv/chain/chain.db"
    assert "node" in node_toml["http"]["allowed_hosts"] and node_toml["fetch"]["allow"] == ["miner"]
    assert services["node"]["environment"]["POT_DATABASE_URL"].startswith("postgresql+psycopg2://")


def dockerignore_admits(path: str) -> bool:
    """Whether .dockerignore lets `path` (relative, no wildcards) into the build context: the last
    pattern that matches it or a folder above it decides (Docker's rule, for the patterns used here)."""
    import fnmatch

    admitted = True
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], pattern[3:]) for p in prefixes)
        else:
            hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
        if hit:
            admitted = negate
    return admitted


def test_dockerignore_admits_every_copy_source():
    copies = [src for src in dockerfile_copies() if not src.startswith("/")]  # COPY --from=deps /opt/venv
    assert copies
    shut = [src for src in copies if not dockerignore_admits(src)]
    assert not shut, f".dockerignore keeps {shut} out of the build context, which deploy/Dockerfile copies"
    for big in (".venv", "node_modules", ".git", "tests", "chain/__pycache__"):
        assert not dockerignore_admits(big), f".dockerignore lets {big} into the build context"


def test_dockerfile_installs_from_the_wheelhouse_alone():
    text = DOCKERFILE.read_text()
    assert "COPY deploy/wheelhouse " in text and "PIP_NO_INDEX=1" in text
    assert "--index-url" not in text and "download.pytorch.org" not in text
    assert re.search(r"^ARG BASE=", text, re.M) and "FROM ${BASE}" in text


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def packaged_top_level() -> set[str]:
    """Top-level package names of [tool.setuptools.packages.find] include ("chain*" -> "chain")."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    names = set()
    for pattern in include:
        name = pattern.split(".", 1)[0].rstrip("*")
        assert name.isidentifier(), f"include pattern {pattern!r} does not start with a package name"
        names.add(name)
    return names


def dockerfile_copies() -> dict[str, str]:
    """COPY source -> destination, for every COPY line of the Dockerfile (flags such as --chown skipped)."""
    copies: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        assert len(args) >= 2, f"COPY needs a source and a destination: {line!r}"
        for src in args[:-1]:
            copies[src.rstrip("/")] = args[-1]
    return copies


def test_dockerfile_copies_every_packaged_package():
    packages = packaged_top_level()
    assert {"commitments", "oracle", "challenges", "chain", "miner", "node", "devnet", "pot"} <= packages
    copies = dockerfile_copies()
    missing = sorted(p for p in packages if p not in copies)
    assert not missing, f"deploy/Dockerfile has no COPY line for {missing}"
    for p in packages:
        assert copies[p].rstrip("/") in (f"./{p}", p), f"COPY {p} {copies[p]}: copy it to ./{p}"
    # A Python package the image copies must be one pip installs, or the image runs it from the
    # working directory only by accident.
    copied_packages = {src for src in copies if (REPO / src / "__init__.py").is_file()}
    stray = sorted(copied_packages - packages)
    assert not stray, f"deploy/Dockerfile copies {stray}, which pyproject.toml does not install"
    # The image needs what pip reads to build the package.
    assert {"pyproject.toml", "README.md"} <= set(copies)


def test_every_packaged_package_exists():
    for p in sorted(packaged_top_level()):
        assert (REPO / p / "__init__.py").is_file(), f"pyproject.toml installs {p}, which is not a package here"


def test_dockerfile_installs_the_postgres_extra():
    assert "postgres" in pyproject()["project"]["optional-dependencies"]
    installs = [line for line in DOCKERFILE.read_text().splitlines()
                if re.match(r"^RUN pip install ", line) and "torch" not in line]
    assert installs, "deploy/Dockerfile installs no package"
    assert any(re.search(r"\.\[[\w,]*\bpostgres\b[\w,]*\]", line) for line in installs), installs


def test_prometheus_scrapes_every_verifier():
    prom = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    services = compose()["services"]
    verifiers = {n for n in services if n.startswith("verifier-")}
    assert targets == {f"{v}:8700" for v in verifiers}
    node_toml = (REPO / "deploy/node.toml").read_text()
    assert 'listen = "0.0.0.0:8700"' in node_toml
    # Each scrape's Host header (the service name) is one the nodes answer to.
    allowed = set(tomllib.loads(node_toml)["http"]["allowed_hosts"])
    assert {t.rpartition(":")[0] for t in targets} <= allowed


def exported_metric_names() -> set[str]:
    """Series names the node's metrics module can export, with the suffixes Prometheus adds."""
    src = (REPO / "node/metrics.py").read_text()
    names: set[str] = set()
    for kind, name in re.findall(r"(GaugeMetricFamily|CounterMetricFamily|SummaryMetricFamily|Counter|Histogram)"
                                 r"\(\s*\"(pot_\w+)\"", src):
        if kind in ("GaugeMetricFamily",):
            names.add(name)
        elif kind in ("CounterMetricFamily", "Counter"):
            names.add(name + "_total")
        elif kind == "SummaryMetricFamily":
            names |= {name + "_sum", name + "_count"}
        else:
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def test_grafana_dashboard_uses_exported_pot_metrics():
    dash = json.loads((REPO / "deploy/grafana/dashboards/pot.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(pot_\w+)", e)}
    exported = exported_metric_names()
    assert exported, "no pot_ metrics found in node/metrics.py"
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    # Every metric any expression names carries the prefix (no foreign or renamed series).
    words = {w for e in exprs for w in re.findall(r"\b([a-z_]+_(?:total|seconds|bucket|sum|count))\b", e)}
    assert all(w.startswith("pot_") for w in words), words
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    uid = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())[
        "datasources"][0]["uid"]
    assert all(p["datasource"]["uid"] == uid for p in dash["panels"])


def test_systemd_unit_runs_the_node():
    unit = (REPO / "deploy/pot-node.service").read_text()
    assert re.search(r"^ExecStart=\S+/pot node run --config ", unit, re.M)
    assert re.search(r"^ExecStartPre=\S+/pot node init --config ", unit, re.M)
    assert "KillSignal=SIGTERM" in unit and "[Install]" in unit
