"""Substrate transports: protocol calls as `pot1` remarks on any chain, or a native PoT pallet.

Every RPC goes through one choke point, `SubstrateClient.call`: a socket timeout, retries with
exponential backoff and jitter, and a new websocket after any failure, opened by us
(substrate-interface's own auto-reconnect is switched off: it silently drops subscriptions). Blocks are read by number
from the finalized head down a cursor, so a reconnect simply resumes where the caller was.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from scalecodec.base import ScaleBytes
from scalecodec.utils.ss58 import ss58_decode, ss58_encode
from substrateinterface import Keypair, SubstrateInterface
from substrateinterface.exceptions import SubstrateRequestException
from websocket import WebSocketException

from chain.calls import CALL_TYPES, Call, CallDecodeError, CallError, decode_call, encode_call, is_pot_payload
from chain.keys import load_key
from chain.transport import Block, Receipt, Transport, TransportError

log = logging.getLogger("chain.substrate")
T = TypeVar("T")

DEFAULT_RPC_TIMEOUT = 30.0
DEFAULT_ERA_PERIOD = 64
# A connection failure is worth retrying; an RPC error answer or a decode error is not.
_RETRYABLE = (ConnectionError, TimeoutError, OSError, WebSocketException)
_BATCH_CALLS = {"batch", "batch_all", "force_batch"}


class RpcError(TransportError):
    """The node answered an RPC with an error object (code and message kept for the caller)."""

    def __init__(self, what: str, code: Any, message: str) -> None:
        super().__init__(f"{what}: node refused ({code}): {message}")
        self.code = code
        self.message = message


class PalletMissingError(TransportError):
    """The connected runtime lacks the PoT pallet, or a call or event the configuration names."""


def _blake2_256(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def _compact(n: int) -> bytes:
    """SCALE compact encoding of a non-negative integer."""
    if n < 1 << 6:
        return bytes([n << 2])
    if n < 1 << 14:
        return ((n << 2) | 1).to_bytes(2, "little")
    if n < 1 << 30:
        return ((n << 2) | 2).to_bytes(4, "little")
    body = n.to_bytes((n.bit_length() + 7) // 8, "little")
    return bytes([((len(body) - 4) << 2) | 3]) + body


def _hex_bytes(value: str) -> bytes:
    if not isinstance(value, str):  # a node's JSON may carry anything; callers catch ValueError
        raise ValueError(f"expected a hex string, got {type(value).__name__}")
    return bytes.fromhex(value[2:] if value.startswith("0x") else value)


class SubstrateClient:
    """One websocket connection to a node, and the one method every RPC goes through."""

    def __init__(
        self,
        url: str,
        *,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
        max_attempts: int = 6,
        backoff_base: float = 0.5,
        backoff_max: float = 15.0,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise TransportError(f"a Substrate node URL must start with ws:// or wss://, got {url!r}")
        if not rpc_timeout > 0 or max_attempts < 1:
            raise TransportError("rpc_timeout must be positive and max_attempts at least 1")
        self.url = url
        self.rpc_timeout = float(rpc_timeout)
        self.max_attempts = int(max_attempts)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.reconnects = 0
        self.ss58_format: int | None = None
        self._si: SubstrateInterface | None = None
        self._socket_lost = False
        self._lock = threading.RLock()
        self._rng = random.Random()

    def _connect(self) -> SubstrateInterface:
        si = SubstrateInterface(
            url=self.url,
            auto_reconnect=False,
            ws_options={"timeout": self.rpc_timeout},
        )
        try:
            si.init_runtime()
            if self.ss58_format is None:
                prefix = si.get_constant("System", "SS58Prefix")
                self.ss58_format = int(prefix.value) if prefix is not None else 42
            si.ss58_format = self.ss58_format
        except BaseException:
            si.close()
            raise
        return si

    def _drop(self) -> None:
        si, self._si = self._si, None
        if si is not None:
            try:
                si.close()
            except Exception:  # a dead socket may fail to close; it is gone either way
                pass

    def _lose_socket(self) -> None:
        """Close the socket but keep the interface: its decoded metadata is costly to rebuild."""
        if self._si is not None:
            try:
                self._si.transport.close()
            except Exception:
                pass
            self._socket_lost = True

    def _ready(self) -> SubstrateInterface:
        if self._si is None:
            self._si = self._connect()
            self._socket_lost = False
        elif self._socket_lost:
            # A fresh websocket under the same interface; request ids keep counting up, so a
            # late answer to a request on the old socket can never be taken for a new one.
            self._si.connect_websocket()
            self._socket_lost = False
            log.info("reconnected to %s", self.url)
        return self._si

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (1-based): exponential, capped, half jittered."""
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return cap / 2 + self._rng.uniform(0, cap / 2)

    def call(self, what: str, fn: Callable[[SubstrateInterface], T], *, retry: bool = True) -> T:
        """Run `fn(interface)`: the choke point for every RPC (timeout, retry, reconnect)."""
        attempts = self.max_attempts if retry else 1
        last: BaseException | None = None
        with self._lock:
            for attempt in range(1, attempts + 1):
                try:
                    return fn(self._ready())
                except SubstrateRequestException as exc:
                    err = exc.args[0] if exc.args else {}
                    if isinstance(err, dict):
                        raise RpcError(what, err.get("code"), str(err.get("message", err))) from None
                    raise RpcError(what, None, str(err)) from None
                except TransportError:
                    raise
                except _RETRYABLE as exc:
                    last = exc
                    self._lose_socket()
                    self.reconnects += 1
                    if attempt == attempts:
                        break
                    delay = self.backoff(attempt)
                    log.warning(
                        "%s: connection to %s failed (%s: %s); retry %d/%d in %.2f s",
                        what,
                        self.url,
                        type(exc).__name__,
                        exc,
                        attempt,
                        attempts - 1,
                        delay,
                    )
                    time.sleep(delay)
                except Exception as exc:
                    # An answer we cannot use (or cannot encode for) is reported, never a crash.
                    raise TransportError(
                        f"{what} failed against {self.url}: {type(exc).__name__}: {exc}"
                    ) from None
        raise TransportError(
            f"{what}: {self.url} unreachable after {attempts} attempt(s): {type(last).__name__}: {last}"
        )

    def rpc(self, method: str, params: list[Any], *, retry: bool = True) -> Any:
        """A raw JSON-RPC request through the choke point; returns the `result` member."""

        def run(si: SubstrateInterface) -> Any:
            reply = si.rpc_request(method, params)
            if "error" in reply:
                raise SubstrateRequestException(reply["error"])
            return reply.get("result")

        return self.call(method, run, retry=retry)

    def ensure_connected(self) -> None:
        self.call("connect", lambda si: None)

    def close(self) -> None:
        with self._lock:
            self._drop()


@dataclass
class _Executed:
    """What the events say about one extrinsic."""

    success: bool = False
    failure: Any = None
    remarks: list[tuple[bytes, bytes]] = field(default_factory=list)  # (sender pubkey, remark hash)
    batch_interrupted: bool = False


class _SubstrateBase(Transport):
    """Signing, nonces, submission and inclusion tracking shared by both transports."""

    def __init__(
        self,
        client: SubstrateClient,
        keypair: Keypair,
        *,
        era_period: int = DEFAULT_ERA_PERIOD,
        inclusion_poll: float = 0.1,
    ) -> None:
        if keypair.crypto_type != 1:
            raise TransportError("Substrate transports sign with sr25519 keys only")
        if not 4 <= era_period <= 65536:
            raise TransportError(f"era_period must be in 4..65536 blocks, got {era_period}")
        self.client = client
        self._keypair = keypair
        self.era_period = era_period
        self.inclusion_poll = inclusion_poll
        self._submit_lock = threading.Lock()
        self._known_final = -1
        # The nonce after our last accepted submission, and the head it was sent at. A node may
        # answer system_accountNextIndex without counting its pool (chopsticks does while it builds
        # the previous block), so back-to-back sends would reuse a nonce and one would be dropped.
        # The floor expires with the era: by then a transaction that never landed is dead anyway.
        self._sent_next: int | None = None
        self._sent_head = 0
        client.ensure_connected()
        self._account = ss58_encode(keypair.public_key, client.ss58_format)

    @property
    def account(self) -> str:
        return self._account

    def close(self) -> None:
        self.client.close()

    # --- reading ----------------------------------------------------------------------------

    def finalized_head(self) -> int:
        h = self.client.rpc("chain_getFinalizedHead", [])
        header = self.client.rpc("chain_getHeader", [h])
        try:
            number = int(header["number"], 16)
        except (TypeError, KeyError, ValueError):
            raise TransportError(f"chain_getHeader({h!r}) answered no usable header") from None
        self._known_final = number
        return number

    def _finalized_hash(self, number: int) -> str:
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise TransportError(f"block number must be an integer >= 0, got {number!r}")
        # Finality only moves forward, so a block at or below a head already seen needs no query.
        if number > self._known_final:
            head = self.finalized_head()
            if number > head:
                raise TransportError(f"block {number} is not finalized yet (finalized head is {head})")
        h = self.client.rpc("chain_getBlockHash", [number])
        if not h:
            raise TransportError(f"the node has no block {number}")
        return h

    def _read_block(self, number: int) -> tuple[str, list[Any], dict[int, _Executed], float | None]:
        """(hash, decoded extrinsics or None per undecodable one, per-extrinsic outcome, timestamp)."""
        block_hash = self._finalized_hash(number)

        def run(si: SubstrateInterface):
            reply = si.rpc_request("chain_getBlock", [block_hash])
            if "error" in reply:
                raise SubstrateRequestException(reply["error"])
            body = reply.get("result") or {}
            exts = (body.get("block") or {}).get("extrinsics") or []
            si.init_runtime(block_hash=block_hash)
            cls = si.runtime_config.get_decoder_class("Extrinsic")
            decoded: list[Any] = []
            for idx, hexdata in enumerate(exts):
                try:
                    raw = _hex_bytes(hexdata)
                    ext = cls(
                        data=ScaleBytes(bytearray(raw)),
                        metadata=si.metadata,
                        runtime_config=si.runtime_config,
                    )
                    ext.decode()
                    # The call is the tail of the extrinsic; its bytes are walked exactly below.
                    call_start = ext.value_object["call"].data_start_offset
                    decoded.append(
                        {"address": ext.value.get("address"), "call": _call_tree(si, raw[call_start:])}
                    )
                except Exception as exc:  # one odd extrinsic must not hide the others
                    log.warning("block %d: extrinsic %d skipped: cannot decode it (%s)", number, idx, exc)
                    decoded.append(None)
            events = si.get_events(block_hash=block_hash)
            return decoded, [e.value for e in events]

        decoded, events = self.client.call(f"read block {number}", run)
        outcome: dict[int, _Executed] = {}
        for ev in events:
            if ev.get("phase") != "ApplyExtrinsic" and not (
                isinstance(ev.get("phase"), dict) and "ApplyExtrinsic" in ev["phase"]
            ):
                continue
            idx = ev.get("extrinsic_idx")
            if idx is None:
                continue
            ex = outcome.setdefault(idx, _Executed())
            mod, name, attrs = ev.get("module_id"), ev.get("event_id"), ev.get("attributes")
            if mod == "System" and name == "ExtrinsicSuccess":
                ex.success = True
            elif mod == "System" and name == "ExtrinsicFailed":
                ex.failure = attrs
            elif mod == "System" and name == "Remarked" and isinstance(attrs, dict):
                try:
                    ex.remarks.append((_pubkey(attrs["sender"]), _hex_bytes(attrs["hash"])))
                except (KeyError, ValueError, TypeError):
                    continue
            elif mod == "Utility" and name in ("BatchInterrupted", "ItemFailed"):
                ex.batch_interrupted = True
        timestamp = None
        for ext in decoded:
            call = (ext or {}).get("call") or {}
            if call.get("module") == "Timestamp" and call.get("function") == "set":
                try:
                    timestamp = int(call["args"][0]["value"]) / 1000.0
                except (KeyError, IndexError, TypeError, ValueError):
                    pass
        return block_hash, decoded, outcome, timestamp

    # --- submission ---------------------------------------------------------------------------

    def _chain_next_nonce(self) -> int:
        value = self.client.rpc("system_accountNextIndex", [self._account])
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TransportError(f"system_accountNextIndex answered {value!r}, not a nonce")
        return value

    def _submit_composed(
        self, compose: Callable[[SubstrateInterface], Any], *, wait: bool, timeout: float
    ) -> Receipt:
        """Sign and send one extrinsic (fresh nonce, mortal era), then optionally await finality."""
        deadline = time.monotonic() + timeout
        with self._submit_lock:
            # The node's next index is the truth once our sends are in its pool or on chain; the
            # sent floor covers the gap before that, and `floor` steps past a nonce another sender
            # holds for one submission.
            floor = 0
            for attempt in range(1, 6):
                head = self.finalized_head()
                sent = self._sent_next if self._sent_next is not None and head <= self._sent_head + self.era_period else 0
                nonce = max(self._chain_next_nonce(), sent, floor)

                def build(si: SubstrateInterface, nonce=nonce, head=head):
                    call = compose(si)
                    ext = si.create_signed_extrinsic(
                        call=call,
                        keypair=self._keypair,
                        era={"period": self.era_period, "current": head},
                        nonce=nonce,
                    )
                    return "0x" + bytes(ext.data.data).hex()

                ext_hex = self.client.call("sign extrinsic", build)
                tx_hash = _blake2_256(_hex_bytes(ext_hex))
                try:
                    # Not retried blindly: after a dropped connection we look before resending.
                    self.client.rpc("author_submitExtrinsic", [ext_hex], retry=False)
                except RpcError as exc:
                    text = f"{exc.code} {exc.message}".lower()
                    if "already imported" in text or exc.code == 1013:
                        pass
                    elif "stale" in text or "outdated" in text:
                        log.info("nonce %d is stale; refreshing it (attempt %d)", nonce, attempt)
                        floor = 0
                        self._sent_next = None
                        continue
                    elif "priority is too low" in text or exc.code == 1014:
                        log.info("nonce %d is taken in the pool; using the next one", nonce)
                        floor = nonce + 1
                        continue
                    else:
                        raise TransportError(f"the node rejected the extrinsic: {exc.message}") from None
                except TransportError as exc:
                    log.warning("submitting the extrinsic failed (%s); checking whether it arrived", exc)
                    time.sleep(self.client.backoff(attempt))
                    try:
                        arrived = self._chain_next_nonce() > nonce
                    except TransportError:
                        arrived = False
                    if not arrived:
                        if time.monotonic() > deadline:
                            raise
                        continue
                self._sent_next, self._sent_head = nonce + 1, head
                receipt = Receipt(tx_hash=tx_hash)
                if not wait:
                    return receipt
                return self._await_inclusion(
                    tx_hash, after=head, era_end=head + self.era_period, deadline=deadline
                )
        raise TransportError("could not find a usable nonce after 5 attempts")

    def _await_inclusion(self, tx_hash: bytes, *, after: int, era_end: int, deadline: float) -> Receipt:
        checked = after
        while True:
            head = self.finalized_head()
            while checked < head:
                checked += 1
                block_hash = self._finalized_hash(checked)
                body = self.client.rpc("chain_getBlock", [block_hash]) or {}
                exts = (body.get("block") or {}).get("extrinsics") or []
                for idx, hexdata in enumerate(exts):
                    if _blake2_256(_hex_bytes(hexdata)) != tx_hash:
                        continue
                    _, _, outcome, _ = self._read_block(checked)
                    ex = outcome.get(idx, _Executed())
                    if not ex.success:
                        raise TransportError(
                            f"extrinsic 0x{tx_hash.hex()} failed in block {checked}: {ex.failure}"
                        )
                    return Receipt(tx_hash=tx_hash, block_number=checked, block_hash=_hex_bytes(block_hash))
            if checked > era_end:
                raise TransportError(
                    f"extrinsic 0x{tx_hash.hex()} was not included before its era ended (block {era_end})"
                )
            if time.monotonic() > deadline:
                raise TransportError(
                    f"extrinsic 0x{tx_hash.hex()} not in a finalized block yet (checked up to {checked})"
                )
            time.sleep(self.inclusion_poll)


def _pubkey(address: Any) -> bytes:
    """The 32-byte account id of an SS58 address, a 0x hex id, or a {'Id': ...} MultiAddress."""
    if isinstance(address, dict) and "Id" in address:
        address = address["Id"]
    if isinstance(address, (list, tuple)) and len(address) == 2 and address[0] == "Id":
        address = address[1]
    if not isinstance(address, str):
        raise ValueError(f"unsupported address form {type(address).__name__}")
    if address.startswith("0x"):
        key = _hex_bytes(address)
    else:
        key = bytes.fromhex(ss58_decode(address))
    if len(key) != 32:
        raise ValueError("account id is not 32 bytes")
    return key


def _read_compact(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the SCALE compact integer at `pos`."""
    mode = data[pos] & 3
    if mode == 0:
        return data[pos] >> 2, pos + 1
    if mode == 1:
        return int.from_bytes(data[pos : pos + 2], "little") >> 2, pos + 2
    if mode == 2:
        return int.from_bytes(data[pos : pos + 4], "little") >> 2, pos + 4
    n = (data[pos] >> 2) + 4
    return int.from_bytes(data[pos + 1 : pos + 1 + n], "little"), pos + 1 + n


def _call_tree(si: SubstrateInterface, data: bytes, depth: int = 0) -> dict[str, Any]:
    """One call decoded from its exact bytes: names, args, raw bytes, and batch children.

    Remark bytes are cut from the raw call rather than taken from the decoder, which turns bytes
    into text or 0x-hex ambiguously; batch children are decoded one by one from their own bytes.
    """
    obj = si.runtime_config.create_scale_object(
        "Call", data=ScaleBytes(bytearray(data)), metadata=si.metadata
    )
    value = obj.decode(check_remaining=False)
    raw = bytes(data[: obj.data.offset])
    node: dict[str, Any] = {
        "module": value["call_module"],
        "function": value["call_function"],
        "args": value["call_args"],
        "raw": raw,
        "inner": [],
    }
    if node["module"] == "Utility" and node["function"] in _BATCH_CALLS and depth < 8:
        count, pos = _read_compact(raw, 2)
        for _ in range(count):
            child = _call_tree(si, raw[pos:], depth + 1)
            node["inner"].append(child)
            pos += len(child["raw"])
    elif node["module"] == "System" and node["function"] in ("remark", "remark_with_event"):
        length, pos = _read_compact(raw, 2)
        node["remark"] = raw[pos : pos + length]
    return node


class RemarkTransport(_SubstrateBase):
    """Protocol calls as `pot1` payloads in `System.remark_with_event` on any Substrate chain."""

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        if not calls:
            raise TransportError("submit needs at least one call")
        payloads = []
        for i, call in enumerate(calls):
            try:
                payloads.append(encode_call(call))
            except CallError as exc:
                raise TransportError(f"call {i} cannot be encoded: {exc}") from None
        return self.submit_remarks(payloads, wait=wait, timeout=timeout)

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit already-encoded calls byte for byte (journal re-sends), refusing non-calls."""
        payloads = [bytes(p) for p in payloads]
        for i, p in enumerate(payloads):
            try:
                decode_call(p)
            except CallDecodeError as exc:
                raise TransportError(f"payload {i} is not a protocol call: {exc}") from None
        return self.submit_remarks(payloads, wait=wait, timeout=timeout)

    def submit_remarks(
        self, payloads: Iterable[bytes], *, wait: bool = True, timeout: float = 60.0
    ) -> Receipt:
        """Put raw remark payloads on chain in one extrinsic (one remark, or Utility.batch_all)."""
        payloads = [bytes(p) for p in payloads]
        if not payloads:
            raise TransportError("submit needs at least one remark")

        def compose(si: SubstrateInterface):
            remarks = [si.compose_call("System", "remark_with_event", {"remark": p}) for p in payloads]
            if len(remarks) == 1:
                return remarks[0]
            return si.compose_call("Utility", "batch_all", {"calls": remarks})

        return self._submit_composed(compose, wait=wait, timeout=timeout)

    def block(self, number: int) -> Block:
        block_hash, decoded, outcome, timestamp = self._read_block(number)
        calls: list[tuple[str, Any]] = []
        for idx, ext in enumerate(decoded):
            if not ext or "address" not in ext:
                continue  # inherents and undecodable extrinsics carry no protocol calls
            where = f"block {number} extrinsic {idx}"
            ex = outcome.get(idx, _Executed())
            remarks = list(_walk_remarks(ext.get("call") or {}, where))
            if not remarks:
                continue
            if not ex.success:
                log.info(
                    "%s: skipped %d remark(s): the extrinsic failed (%s)", where, len(remarks), ex.failure
                )
                continue
            try:
                signer = _pubkey(ext["address"])
            except ValueError as exc:
                log.warning("%s: skipped: signer address unusable (%s)", where, exc)
                continue
            origin = ss58_encode(signer, self.client.ss58_format)
            # The Remarked events are the executed remarks, in order; a remark inside an
            # interrupted Utility.batch has none and is left out.
            pending = list(ex.remarks)
            for payload in remarks:
                digest = _blake2_256(payload)
                hit = next((i for i, (who, h) in enumerate(pending) if h == digest and who == signer), None)
                if hit is None:
                    log.info("%s: skipped a remark that did not execute", where)
                    continue
                del pending[: hit + 1]
                if not is_pot_payload(payload):
                    log.info("%s: skipped foreign remark (%d bytes, not pot1)", where, len(payload))
                    continue
                try:
                    calls.append((origin, decode_call(payload)))
                except CallDecodeError as exc:
                    log.warning("%s: skipped malformed pot1 remark from %s: %s", where, origin, exc)
        return Block(number=number, hash=_hex_bytes(block_hash), calls=tuple(calls), timestamp=timestamp)


def _walk_remarks(call: Mapping[str, Any], where: str) -> Iterable[bytes]:
    """Remark payloads of a call tree in execution order (remark_with_event, inside batches)."""
    module, function = call.get("module"), call.get("function")
    if module == "System" and function == "remark_with_event":
        yield call["remark"]
    elif module == "System" and function == "remark":
        log.info("%s: skipped System.remark (protocol calls travel in remark_with_event)", where)
    for inner in call.get("inner") or ():
        yield from _walk_remarks(inner, where)


@dataclass(frozen=True)
class PalletConfig:
    """Names of the PoT pallet, its calls (by protocol call name) and its events, as on chain."""

    pallet: str = "ProofOfTraining"
    calls: Mapping[str, str] = field(default_factory=lambda: {name: name for name in CALL_TYPES})
    events: tuple[str, ...] = ("ChallengeIssued", "ChallengeResolved", "MinerSlashed")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | PalletConfig | None) -> PalletConfig:
        if data is None:
            return cls()
        if isinstance(data, PalletConfig):
            return data
        unknown = set(data) - {"pallet", "calls", "events"}
        if unknown:
            raise TransportError(f"pallet configuration: unknown key(s) {', '.join(sorted(unknown))}")
        base = cls()
        calls = dict(base.calls)
        calls.update(data.get("calls") or {})
        bad = set(calls) - set(CALL_TYPES)
        if bad:
            raise TransportError(
                f"pallet configuration names unknown protocol call(s): {', '.join(sorted(bad))}"
            )
        return cls(
            pallet=str(data.get("pallet", base.pallet)),
            calls=calls,
            events=tuple(data.get("events", base.events)),
        )


class PalletTransport(_SubstrateBase):
    """Protocol calls as calls of a native PoT pallet; refuses runtimes that lack it."""

    def __init__(
        self, client: SubstrateClient, keypair: Keypair, *, config: PalletConfig | None = None, **kw
    ):
        self.config = config or PalletConfig()
        self._checked_version: Any = None
        super().__init__(client, keypair, **kw)
        self.check_runtime()

    def check_runtime(self) -> None:
        """Compare the configured pallet, calls (with their argument names) and events with metadata."""

        def run(si: SubstrateInterface):
            si.init_runtime()
            pallets = {p.name: p for p in si.metadata.pallets}
            return si.runtime_version, si.chain, pallets

        version, chain_name, pallets = self.client.call("read metadata", run)
        if version == self._checked_version:
            return
        cfg = self.config
        pallet = pallets.get(cfg.pallet)
        if pallet is None:
            raise PalletMissingError(
                f"the runtime of {chain_name!r} at {self.client.url} (spec version {version}) has no pallet "
                f"{cfg.pallet!r}; it has {', '.join(sorted(pallets))}. Use the substrate-remark transport "
                f"(kind='remark', calls as pot1 remarks) on chains without a native PoT pallet."
            )
        calls = {c.name: c for c in (pallet.calls or [])}
        for proto_name, chain_name_ in cfg.calls.items():
            call = calls.get(chain_name_)
            if call is None:
                raise PalletMissingError(
                    f"pallet {cfg.pallet!r} has no call {chain_name_!r} (for {proto_name}); "
                    f"it has {', '.join(sorted(calls)) or 'no calls'}"
                )
            have = [a.name for a in call.args]
            want = list(CALL_TYPES[proto_name].FIELDS)
            if have != want:
                raise PalletMissingError(
                    f"{cfg.pallet}.{chain_name_} takes ({', '.join(have)}), the protocol call {proto_name} "
                    f"has ({', '.join(want)})"
                )
        events = {e.name for e in (pallet.events or [])}
        missing = [e for e in cfg.events if e not in events]
        if missing:
            raise PalletMissingError(f"pallet {cfg.pallet!r} lacks event(s) {', '.join(missing)}")
        self._checked_version = version

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        if not calls:
            raise TransportError("submit needs at least one call")
        for i, call in enumerate(calls):
            if not isinstance(call, Call) or type(call).NAME not in CALL_TYPES:
                raise TransportError(f"call {i} is not a protocol call: {type(call).__name__}")
        self.check_runtime()
        cfg = self.config

        def compose(si: SubstrateInterface):
            composed = [si.compose_call(cfg.pallet, cfg.calls[c.NAME], _pallet_args(c)) for c in calls]
            if len(composed) == 1:
                return composed[0]
            return si.compose_call("Utility", "batch_all", {"calls": composed})

        return self._submit_composed(compose, wait=wait, timeout=timeout)

    def block(self, number: int) -> Block:
        block_hash, decoded, outcome, timestamp = self._read_block(number)
        by_chain_name = {v: k for k, v in self.config.calls.items()}
        calls: list[tuple[str, Any]] = []
        for idx, ext in enumerate(decoded):
            if not ext or "address" not in ext:
                continue
            where = f"block {number} extrinsic {idx}"
            found = list(_walk_pallet(ext.get("call") or {}, self.config.pallet, batch=False))
            if not found:
                continue
            ex = outcome.get(idx, _Executed())
            if not ex.success:
                log.info("%s: skipped %d pallet call(s): the extrinsic failed", where, len(found))
                continue
            try:
                origin = ss58_encode(_pubkey(ext["address"]), self.client.ss58_format)
            except ValueError as exc:
                log.warning("%s: skipped: signer address unusable (%s)", where, exc)
                continue
            for pcall, in_batch in found:
                if in_batch and ex.batch_interrupted:
                    log.info("%s: skipped a pallet call inside an interrupted Utility.batch", where)
                    continue
                proto = by_chain_name.get(pcall.get("function"))
                if proto is None:
                    log.info("%s: skipped pallet call %s (not configured)", where, pcall.get("function"))
                    continue
                try:
                    calls.append((origin, self._decode_pallet_call(proto, pcall)))
                except (CallError, ValueError, TypeError) as exc:
                    log.warning("%s: skipped malformed %s call: %s", where, proto, exc)
        return Block(number=number, hash=_hex_bytes(block_hash), calls=tuple(calls), timestamp=timestamp)

    def events(self, number: int) -> list[tuple[str, Any]]:
        """The configured pallet events of finalized block `number`, as (name, attributes)."""
        block_hash = self._finalized_hash(number)
        evs = self.client.call(
            f"events of block {number}", lambda si: [e.value for e in si.get_events(block_hash=block_hash)]
        )
        wanted = set(self.config.events)
        return [
            (e["event_id"], e.get("attributes"))
            for e in evs
            if e.get("module_id") == self.config.pallet and e.get("event_id") in wanted
        ]

    def _decode_pallet_call(self, proto: str, pcall: Mapping[str, Any]) -> Call:
        cls = CALL_TYPES[proto]
        values = {a.get("name"): a.get("value") for a in pcall.get("args") or []}
        if set(values) != set(cls.FIELDS):
            raise CallError(
                f"arguments ({', '.join(map(str, values))}) differ from ({', '.join(cls.FIELDS)})"
            )
        options: dict[str, list[Any]] = {}
        for name, v in values.items():
            options[name] = _field_readings(v)
        # Text-or-hex readings are ambiguous; the one that re-encodes to the bytes on chain wins.
        want = pcall["raw"]
        combos: list[dict[str, Any]] = [{}]
        for name, opts in options.items():
            combos = [dict(c, **{name: o}) for c in combos for o in opts]
        cfg = self.config
        for combo in combos[:16]:
            try:
                call = cls(**combo)
            except CallError:
                continue
            data = self.client.call(
                "encode pallet call",
                lambda si, call=call: bytes(
                    si.compose_call(cfg.pallet, cfg.calls[proto], _pallet_args(call)).data.data
                ),
            )
            if data == want:
                return call
        raise CallError("no reading of the arguments re-encodes to the call on chain")


def _field_readings(v: Any) -> list[Any]:
    if isinstance(v, list):
        return [[_hex_bytes(x) if isinstance(x, str) else x for x in v]]
    if isinstance(v, str):
        out: list[Any] = [v, v.encode("utf-8")]
        if v.startswith("0x"):
            try:
                out.insert(0, bytes.fromhex(v[2:]))
            except ValueError:
                pass
        return out
    return [v]


def _pallet_args(call: Call) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in call.to_wire().items()}


def _walk_pallet(call: Mapping[str, Any], pallet: str, *, batch: bool):
    """(pallet call, inside a non-atomic batch?) for every call of `pallet` in a call tree."""
    module, function = call.get("module"), call.get("function")
    if module == pallet:
        yield call, batch
    inner_batch = batch or (module == "Utility" and function != "batch_all")
    for inner in call.get("inner") or ():
        yield from _walk_pallet(inner, pallet, batch=inner_batch)


_CLIENT_OPTS = {"rpc_timeout", "max_attempts", "backoff_base", "backoff_max"}
_TRANSPORT_OPTS = {"era_period", "inclusion_poll"}


def connect_substrate(url: str, key_uri: str, kind: str = "remark", **opts: Any) -> Transport:
    """A remark or pallet transport to the node at `url`, signing with the key `key_uri`.

    Options: password (for a keystore), rpc_timeout, max_attempts, backoff_base, backoff_max,
    era_period, inclusion_poll, and for kind="pallet" `pallet` (a PalletConfig or a mapping with
    pallet/calls/events).
    """
    password = opts.pop("password", None)
    pallet_cfg = opts.pop("pallet", None)
    unknown = set(opts) - _CLIENT_OPTS - _TRANSPORT_OPTS
    if unknown:
        raise TypeError(f"connect_substrate: unknown option(s) {', '.join(sorted(unknown))}")
    if kind not in ("remark", "pallet"):
        raise TransportError(f"unknown Substrate transport kind {kind!r}; use 'remark' or 'pallet'")
    if kind == "remark" and pallet_cfg is not None:
        raise TransportError("the 'pallet' option only applies to kind='pallet'")
    # Configuration mistakes are refused before any connection is made.
    config = PalletConfig.from_mapping(pallet_cfg) if kind == "pallet" else None
    client = SubstrateClient(url, **{k: v for k, v in opts.items() if k in _CLIENT_OPTS})
    try:
        client.ensure_connected()
        keypair = load_key(key_uri, password, ss58_format=client.ss58_format or 42)
        kw = {k: v for k, v in opts.items() if k in _TRANSPORT_OPTS}
        if config is None:
            return RemarkTransport(client, keypair, **kw)
        return PalletTransport(client, keypair, config=config, **kw)
    except BaseException:
        client.close()
        raise


__all__ = [
    "PalletConfig",
    "PalletMissingError",
    "PalletTransport",
    "RemarkTransport",
    "RpcError",
    "SubstrateClient",
    "connect_substrate",
]
