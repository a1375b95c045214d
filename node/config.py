"""The node's configuration: one TOML (examples/node.toml documents every key) plus a secrets file.

Any key can be overridden by the environment as POT_<SECTION>_<KEY> (e.g. POT_CHAIN_URL); the
secrets file's keys as POT_KEY_<KEY>. Both are validated at start; errors name the key and file.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from chain.protocol.params import ProtocolParams

ENV_PREFIX = "POT"
# Keys an older node config held for test networks only: faults are injected by the harness now
# (node/hooks.py, devnet/node_faults.py), never configured.
TEST_ONLY_KEYS = ("fault", "fault_kill_at")


class ConfigError(ValueError):
    """A configuration or secrets problem, naming the file, the key and what is wrong."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSection(_Section):
    data_dir: str = "pot-node-data"
    # Downloads (openings, leaf lists) live here; best on a volume of their own. Empty: data_dir/openings.
    openings_dir: str = ""
    openings_quota_bytes: int = Field(0, ge=0)  # 0: no quota (the reserve still holds)
    openings_reserve_bytes: int = Field(256 * 1024**2, ge=0)
    # The part of the quota (without one: of what the disk gives above the reserve) one miner's downloads may hold.
    openings_miner_share: float = Field(0.5, gt=0, le=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    secrets_file: str = ""
    loop_interval_s: float = Field(0.2, gt=0, le=10)

    @model_validator(mode="before")
    @classmethod
    def _no_test_knobs(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = [k for k in TEST_ONLY_KEYS if k in data]
            if found:
                raise ValueError(
                    f"{' and '.join(found)} {'is' if len(found) == 1 else 'are'} not a node setting: test faults are "
                    f"injected by a test network's harness (`pot devnet node --fault ...`), never configured; "
                    f"remove the key")
        return data

    @model_validator(mode="after")
    def _apart(self) -> NodeSection:
        # Pruning the openings folder must never reach the database beside it.
        if self.openings_dir and os.path.normpath(self.openings_dir) == os.path.normpath(self.data_dir):
            raise ValueError("openings_dir must be a folder of its own, not data_dir itself")
        return self


class ChainSection(_Section):
    url: str = "dev:///pot-chain.db"
    account: str = ""  # dev chains: the account name; Substrate: the key comes from the secrets file
    kind: Literal["remark", "pallet"] = "remark"
    start_block: int = Field(0, ge=0)  # a fresh database follows the chain from the block after this
    # The account that configures the network (configure_network). A dev chain names its own (the
    # file's creator; a pin must agree); on a Substrate chain a node refuses to start without one.
    authority: str = ""
    poll_s: float = Field(0.5, gt=0, le=60)
    watchdog_s: float = Field(60.0, gt=0)
    rpc_timeout_s: float = Field(30.0, gt=0)
    submit_timeout_s: float = Field(60.0, gt=0)
    resend_after_blocks: int = Field(3, ge=1)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("dev://", "ws://", "wss://")):
            raise ValueError("must be dev:///path/to/chain.db, ws://host:port or wss://host:port")
        return v


class DatabaseSection(_Section):
    url: str = ""  # empty: sqlite:///<data_dir>/node.db

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v and not v.startswith(("sqlite:", "postgresql:", "postgresql+psycopg2:")):
            raise ValueError("must be an sqlite:///... or postgresql://... URL")
        if v.startswith("postgresql"):
            try:
                import psycopg2  # noqa: F401  (only a PostgreSQL URL needs the driver)
            except ImportError:
                raise ValueError("PostgreSQL needs the psycopg2 driver: pip install 'pot-verifier[postgres]'") from None
        return v


class FetchSection(_Section):
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(30.0, gt=0)
    total_timeout_s: float = Field(300.0, gt=0)
    max_opening_bytes: int = Field(4 * 1024**3, ge=1024)
    max_leaves_bytes: int = Field(64 * 1024**2, ge=1024)
    attempts: int = Field(5, ge=1, le=100)
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(15.0, gt=0)
    # Networks broader than /8 (IPv4) or /16 (IPv6), or covering an IPv4-embedding prefix, in `allow`.
    allow_broad: bool = False
    # Hosts and networks (addresses or CIDRs) opened to downloads although not globally routable.
    allow: list[str] = Field(default_factory=list)
    proxy: str = ""  # http(s)://host:port of an operator's proxy; the environment's proxy variables are ignored

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str], info: Any) -> list[str]:  # a pydantic ValidationInfo
        from node.egress import parse_allow

        parse_allow(v, broad=bool(info.data.get("allow_broad")))
        return v

    @field_validator("proxy")
    @classmethod
    def _proxy(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("must be empty or an http://host:port or https://host:port URL")
        return v

    def policy(self):
        """The node.fetch.FetchPolicy these settings give (egress allow-list and proxy included)."""
        from node.egress import EgressPolicy
        from node.fetch import FetchPolicy

        return FetchPolicy(self.connect_timeout_s, self.read_timeout_s, self.total_timeout_s, self.attempts,
                           self.backoff_base_s, self.backoff_max_s,
                           egress=EgressPolicy.from_allow(self.allow, broad=self.allow_broad,
                                                          dns_timeout_s=self.connect_timeout_s),
                           proxy=self.proxy)


class ReplaySection(_Section):
    workers: int = Field(1, ge=1, le=256)
    timeout_s: float = Field(1800.0, gt=0)
    # "local": a pool of worker processes on this machine; "ray": tasks on a Ray cluster (node.cluster)
    backend: Literal["local", "ray"] = "local"
    address: str = ""  # the Ray cluster to join ("host:port" of its head, or "auto"); backend "ray" only
    max_retries: int = Field(3, ge=0, le=100)  # a task whose worker or node died runs again elsewhere

    @model_validator(mode="after")
    def _cluster(self) -> ReplaySection:
        if self.backend == "ray" and not self.address.strip():
            raise ValueError('backend "ray" needs address (the head\'s host:port, or "auto")')
        return self


class ScheduleSection(_Section):
    """Deadlines and fairness: stage budgets from the protocol windows, a cap of jobs per miner."""

    stage_threads: int = Field(4, ge=1, le=256)
    max_jobs_per_miner: int = Field(2, ge=1, le=256)
    block_time_s: float = Field(6.0, gt=0, le=600)
    commit_margin_blocks: int = Field(2, ge=1)
    fetch_share: float = Field(0.5, gt=0, le=1)
    fetch_max_s: float = Field(900.0, gt=0)
    validate_max_s: float = Field(120.0, gt=0)
    losschecks_max_s: float = Field(60.0, gt=0)
    stage_attempts: int = Field(3, ge=1, le=100)


class LossChecksSection(_Section):
    window: int = Field(3, ge=1)
    noise_sigmas: float = Field(3.0, gt=0)
    max_drop_factor: float = Field(4.0, gt=1)
    plateau_steps: int = Field(4, ge=2)
    max_jump_factor: float = Field(2.0, gt=1)


_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def normalize_host(name: str) -> str:
    """A host name as the Host check compares it: lower case, no trailing dot, an IPv6 address in
    brackets and compressed. ValueError (with the reason) for anything that is not one name."""
    h = name.strip().lower().removesuffix(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h:
        try:
            return f"[{ipaddress.IPv6Address(h).compressed}]"
        except ValueError:
            raise ValueError(f"{name[:80]!r} is neither a host name nor an IPv6 address (names carry no port)") from None
    if not h or len(h) > 253 or not _HOST_NAME.match(h):
        raise ValueError(f"{name[:80]!r} is not a host name or IP address")
    return h


class HttpSection(_Section):
    listen: str = "127.0.0.1:8700"
    admin_token_file: str = ""  # a file holding the bearer token of the admin routes; empty: disabled
    # The names a request's Host header may carry (DNS rebinding defence). Empty: the listen host,
    # 127.0.0.1, localhost and [::1]; ["*"]: any Host (no check).
    allowed_hosts: list[str] = Field(default_factory=list)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port, e.g. 127.0.0.1:8700")
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        if "*" in v and len(v) > 1:
            raise ValueError('"*" (no Host check) stands alone; drop the other names or the "*"')
        for name in v:
            if name != "*":
                normalize_host(name)
        return v

    def host_names(self) -> frozenset[str] | None:
        """The normalized names the Host header may carry; None when the check is off ("*")."""
        if self.allowed_hosts == ["*"]:
            return None
        if self.allowed_hosts:
            return frozenset(normalize_host(n) for n in self.allowed_hosts)
        return frozenset((normalize_host(self.listen.rpartition(":")[0]), *LOOPBACK_NAMES))


_P = ProtocolParams()


class ProtocolSection(_Section):
    """A pin of the protocol parameters: the chain's record (configure_network, or a dev chain
    file's own) is the rulebook, and a node whose [protocol] section disagrees with it refuses to
    start. Needed only on a chain that records none. Defaults: chain.protocol.ProtocolParams'."""

    commit_window: int = _P.commit_window
    reveal_window: int = _P.reveal_window
    opening_deadline: int = _P.opening_deadline
    challenges_per_run: int = _P.challenges_per_run
    challenge_delay: int = _P.challenge_delay
    quorum_min_reveals: int = _P.quorum_min_reveals
    quorum_share: list[int] | str = Field(default_factory=lambda: [_P.quorum_share.numerator,
                                                                   _P.quorum_share.denominator])  # [num, den] or "num/den"
    miner_stake: int = _P.miner_stake
    verifier_stake: int = _P.verifier_stake
    slash_amount: int = _P.slash_amount
    committee_size: int = _P.committee_size
    max_rounds: int = _P.max_rounds
    no_show_penalty: int = _P.no_show_penalty
    outlier_penalty: int = _P.outlier_penalty
    unbonding_delay: int = _P.unbonding_delay
    block_seconds: int = _P.block_seconds
    reference_flops: int = _P.reference_flops
    reference_bytes_per_s: int = _P.reference_bytes_per_s
    replay_margin: int = _P.replay_margin
    max_replay_blocks: int = _P.max_replay_blocks
    forced_challenge_steps: list[int] = Field(default_factory=list)
    planck_per_unit: int = _P.planck_per_unit
    fee_per_replay_block: int = _P.fee_per_replay_block
    slash_reward_share: list[int] | str = Field(default_factory=lambda: [_P.slash_reward_share.numerator,
                                                                         _P.slash_reward_share.denominator])
    dispute_honest_share: list[int] | str = Field(default_factory=lambda: [_P.dispute_honest_share.numerator,
                                                                            _P.dispute_honest_share.denominator])
    escalation_window: int = _P.escalation_window
    escalation_stake: int = _P.escalation_stake

    def params(self):
        from fractions import Fraction

        shares = {}
        for name in ("quorum_share", "slash_reward_share", "dispute_honest_share"):
            share = getattr(self, name)
            if isinstance(share, list):
                if len(share) != 2:
                    raise ValueError(f"{name} must be [numerator, denominator]")
                share = Fraction(share[0], share[1])
            shares[name] = Fraction(share)
        return ProtocolParams(**{**self.model_dump(), **shares,
                                 "forced_challenge_steps": tuple(self.forced_challenge_steps)})

    @model_validator(mode="after")
    def _check(self) -> ProtocolSection:
        try:
            self.params()
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(str(exc)) from None
        return self


class VerifierSection(_Section):
    """This node's verifier bond (committees are drawn from bonded accounts only) and whether it
    escalates a round it dissents from."""

    # The active bond the node keeps: on start and after a reconnect, a bond below it is topped
    # up with one bond_verifier call. "auto": the chain's verifier_stake (the least a committee
    # seat needs); 0: never bond (a node that only follows the chain).
    bond: int | Literal["auto"] = "auto"
    # Protocol v3: when a round this node revealed on is about to resolve to another value half
    # than its own, escalate it to the dispute round (one escalate_challenge call, reserving the
    # chain's escalation_stake of free bond, lost if the dispute proves the node wrong).
    escalate: bool = True

    @field_validator("bond")
    @classmethod
    def _bond(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError('must be "auto", 0 (no bond) or a positive amount')
        return v

    def target(self, params) -> int:
        """The bond to keep under protocol `params`."""
        return params.verifier_stake if self.bond == "auto" else int(self.bond)


class NodeConfig(_Section):
    node: NodeSection = NodeSection()
    verifier: VerifierSection = VerifierSection()
    chain: ChainSection = ChainSection()
    database: DatabaseSection = DatabaseSection()
    fetch: FetchSection = FetchSection()
    replay: ReplaySection = ReplaySection()
    schedule: ScheduleSection = ScheduleSection()
    losschecks: LossChecksSection = LossChecksSection()
    http: HttpSection = HttpSection()
    protocol: ProtocolSection = ProtocolSection()

    @property
    def data_dir(self) -> Path:
        return Path(self.node.data_dir)

    def pinned_params(self):
        """The [protocol] section's parameters when the config gives the section, else None (the
        node takes the chain's)."""
        return self.protocol.params() if "protocol" in self.model_fields_set else None

    @property
    def openings_dir(self) -> Path:
        return Path(self.node.openings_dir) if self.node.openings_dir else self.data_dir / "openings"

    def openings_store(self):
        """The openings folder with its quota and reserve (node.fetch.OpeningsStore)."""
        from node.fetch import OpeningsStore

        return OpeningsStore(self.openings_dir, self.node.openings_quota_bytes, self.node.openings_reserve_bytes,
                             self.node.openings_miner_share)

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{(self.data_dir / 'node.db').as_posix()}"


class Secrets(_Section):
    """The signing key: exactly one of uri, mnemonic or keystore (+ password)."""

    uri: str = ""
    mnemonic: str = ""
    keystore: str = ""
    password: str = ""

    @model_validator(mode="after")
    def _one(self) -> Secrets:
        given = [k for k in ("uri", "mnemonic", "keystore") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"give exactly one of uri, mnemonic, keystore (got {', '.join(given)})")
        if self.password and not self.keystore:
            raise ValueError("password only applies to a keystore")
        return self

    @property
    def key(self) -> str | None:
        return self.uri or self.mnemonic or self.keystore or None

    def __repr__(self) -> str:  # never print a secret
        return f"Secrets(uri={'***' if self.uri else ''!r}, mnemonic={'***' if self.mnemonic else ''!r}, " \
               f"keystore={self.keystore!r})"


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    """The file's TOML tables; every way the bytes can be unreadable is a ConfigError naming the file."""
    if "\0" in str(path):
        raise ConfigError(f"{what} path {str(path)!r} contains a NUL byte")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start} ({exc.reason})") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} nests arrays or inline tables too deeply to read") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(f"{what} {path} holds a value that cannot be read: {exc}") from None


def _env_overrides(data: dict[str, Any], sections: dict[str, type[BaseModel]], env: dict[str, str],
                   prefix: str) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for section, model in sections.items():
        for key, field in model.model_fields.items():
            name = f"{prefix}_{section.upper()}_{key.upper()}" if section else f"{prefix}_{key.upper()}"
            if name not in env:
                continue
            raw: Any = env[name]
            if field.annotation is not None and "list[str]" in str(field.annotation):
                raw = raw.replace(",", " ").split()
            elif field.annotation is not None and "list" in str(field.annotation) and "/" not in raw:
                try:
                    raw = [int(x) for x in raw.replace(",", " ").split()] if raw.strip() else []
                except ValueError:
                    raise ConfigError(f"environment variable {name}: {raw[:60]!r} is not a list of integers "
                                      f"(separate them with commas or spaces)") from None
            if section:
                target = out.setdefault(section, {})
                if not isinstance(target, dict):
                    raise ConfigError(f"[{section}] must be a table")
                target[key] = raw
            else:
                out[key] = raw
    return out


def _explain(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see examples/node.toml for the documented keys)"
        lines.append(f"  {loc}: {msg}")
    return f"{where}:\n" + "\n".join(lines)


def load_config(path: str | os.PathLike[str] | None, env: dict[str, str] | None = None) -> NodeConfig:
    """Read and validate the node config (None: defaults), applying POT_<SECTION>_<KEY> overrides."""
    env = dict(os.environ if env is None else env)
    data = _read_toml(Path(path), "config file") if path is not None else {}
    sections = {name: f.annotation for name, f in NodeConfig.model_fields.items()}
    data = _env_overrides(data, sections, env, ENV_PREFIX)  # type: ignore[arg-type]
    try:
        cfg = NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, f"config {path or '(defaults)'} is invalid")) from None
    if path is not None:
        for key, value in (("node.data_dir", cfg.node.data_dir), ("node.openings_dir", cfg.node.openings_dir),
                           ("node.secrets_file", cfg.node.secrets_file),
                           ("http.admin_token_file", cfg.http.admin_token_file)):
            if "\0" in value:
                raise ConfigError(f"config {path} is invalid:\n  {key}: a path cannot contain a NUL byte")
        base = Path(path).resolve().parent
        node = cfg.node
        updates: dict[str, Any] = {}
        if not Path(node.data_dir).is_absolute():
            updates["data_dir"] = str(base / node.data_dir)
        if node.openings_dir and not Path(node.openings_dir).is_absolute():
            updates["openings_dir"] = str(base / node.openings_dir)
        if node.secrets_file and not Path(node.secrets_file).is_absolute():
            updates["secrets_file"] = str(base / node.secrets_file)
        if updates:
            cfg = cfg.model_copy(update={"node": node.model_copy(update=updates)})
        if cfg.node.openings_dir and Path(cfg.node.openings_dir).resolve() == Path(cfg.node.data_dir).resolve():
            raise ConfigError(f"config {path} is invalid:\n  node.openings_dir: must be a folder of its own, "
                              f"not data_dir itself")
        token_file = cfg.http.admin_token_file
        if token_file and not Path(token_file).is_absolute():
            cfg = cfg.model_copy(update={"http": cfg.http.model_copy(update={"admin_token_file": str(base / token_file)})})
    return cfg


def load_secrets(path: str | os.PathLike[str] | None, env: dict[str, str] | None = None) -> Secrets:
    """Read the secrets file ([key] table) with POT_KEY_<KEY> overrides; refuse loose permissions."""
    env = dict(os.environ if env is None else env)
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        raw = _read_toml(p, "secrets file")
        if set(raw) - {"key"}:
            raise ConfigError(f"secrets file {p}: only a [key] table is allowed, found {sorted(set(raw) - {'key'})}")
        data = dict(raw.get("key", {}))
        if os.name == "posix" and p.stat().st_mode & 0o077:
            raise ConfigError(f"secrets file {p} is readable by others (mode {p.stat().st_mode & 0o777:o}); "
                              f"run: chmod 600 {p}")
    data = _env_overrides({"key": data}, {"key": Secrets}, env, ENV_PREFIX)["key"]
    try:
        return Secrets.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, f"secrets {path or '(environment)'} are invalid")) from None


def check_authority(cfg: NodeConfig) -> None:
    """A Substrate chain names no authority of its own: the node must pin it, or the first sender of
    a configure_network record would set the network's parameters."""
    if not cfg.chain.url.startswith("dev://") and not cfg.chain.authority:
        raise ConfigError(
            "chain.authority (POT_CHAIN_AUTHORITY) is not set: on a Substrate chain a node pins the account "
            "whose configure_network records set the network's parameters, e.g.\n  [chain]\n  authority = "
            "\"5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY\"  # the SS58 address that configures the network")


def check_signer(cfg: NodeConfig, secrets: Secrets) -> None:
    """The chain URL decides what identifies this node: a dev account name or a Substrate key."""
    if cfg.chain.url.startswith("dev://"):
        if not cfg.chain.account:
            raise ConfigError("chain.account (POT_CHAIN_ACCOUNT) names this node's account on a dev chain")
    elif secrets.key is None:
        raise ConfigError("a Substrate chain needs a signing key: set [key] uri, mnemonic or keystore in the "
                          "secrets file (node.secrets_file) or POT_KEY_URI")
