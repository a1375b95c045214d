"""The remark transport on a real runtime (chopsticks): round trips, batches, signers, skips."""

from __future__ import annotations

import logging
import time

import pytest
from substrateinterface import SubstrateInterface

from chain.calls import CommitWitness, DeclareWitnessNormBucket, RevealWitnessValue, encode_call
from chain.keys import load_key
from chain.protocol import ProtocolParams
from chain.substrate import RemarkTransport, TransportError, connect_substrate
from tests.chain.chopsticks_env import (  # noqa: F401 - the fixture is used by name
    ACCOUNTS,
    Chopsticks,
    chopsticks,
    fresh_chain,
    make_network,
    unique_key,
)

pytestmark = pytest.mark.chopsticks

CID = bytes(range(32))


def _commit(i: int) -> CommitWitness:
    return CommitWitness(challenge_id=CID, commitment=bytes([i]) * 32)


@pytest.fixture
def pair(chopsticks: Chopsticks):  # noqa: F811
    """Two funded remark transports on a fresh chain."""
    fresh_chain(chopsticks)
    a = connect_substrate(chopsticks.url, unique_key("a"), kind="remark")
    b = connect_substrate(chopsticks.url, unique_key("b"), kind="remark")
    chopsticks.fund([a.account, b.account])
    yield a, b
    a.close()
    b.close()


def _raw_submit(node: Chopsticks, si: SubstrateInterface, key_uri: str, build) -> int:
    """Sign and send an extrinsic built by `build(si)` outside our transport; return its block."""
    kp = load_key(key_uri, ss58_format=si.ss58_format or 42)
    before = node.head()[0]
    ext = si.create_signed_extrinsic(call=build(si), keypair=kp, era={"period": 64})
    si.rpc_request("author_submitExtrinsic", [str(ext.data)])
    deadline = time.monotonic() + 30
    while node.head()[0] == before:
        assert time.monotonic() < deadline, "chopsticks did not build a block for the extrinsic"
        time.sleep(0.05)
    return node.head()[0]


def test_round_trip_with_signer(pair):
    a, b = pair
    call = RevealWitnessValue(
        challenge_id=CID, value_hash=b"\x07" * 32, proof_hash=b"\x08" * 32, norm_bucket=-3, salt=b"s" * 16
    )
    t0 = time.monotonic()
    receipt = a.submit([call])
    latency = time.monotonic() - t0
    assert receipt.block_number is not None and receipt.block_number <= a.finalized_head()
    block = b.block(receipt.block_number)  # read by another account's transport
    assert block.calls == ((a.account, call),)
    assert block.hash == receipt.block_hash and len(block.hash) == 32
    assert block.timestamp is not None and block.timestamp > 1.6e9
    assert a.account.startswith(("C", "D", "E", "F", "G", "H", "J"))  # SS58 prefix 2 of this runtime
    print(f"remark inclusion latency: {latency:.2f} s")
    assert latency < 10


def test_batch_all_keeps_order_and_origins(pair):
    a, b = pair
    calls = [_commit(i) for i in range(1, 5)] + [DeclareWitnessNormBucket(challenge_id=CID, bucket=9)]
    ra = a.submit(calls)
    rb = b.submit([_commit(99)])
    assert a.block(ra.block_number).calls == tuple((a.account, c) for c in calls)
    assert b.block(rb.block_number).calls == ((b.account, _commit(99)),)


def test_foreign_and_malformed_remarks_are_skipped_with_reason(pair, caplog):
    a, _ = pair
    good = _commit(1)
    payloads = [b"hello chain", b"pot1" + b"\xff\x00", encode_call(good), b"0x706f7431", b"pot1 text"]
    with caplog.at_level(logging.INFO, logger="chain.substrate"):
        receipt = a.submit_remarks(payloads)
        block = a.block(receipt.block_number)
    assert block.calls == ((a.account, good),)
    text = caplog.text
    assert "skipped foreign remark (11 bytes" in text
    assert "malformed pot1 remark" in text and "not canonical CBOR" in text
    # "0x706f7431" is the hex of pot1 spelled as text: a near miss, recorded like a malformed call.
    assert [(ig.position, ig.reason) for ig in block.ignored] == [
        (1, "bad_cbor"),
        (3, "bad_prefix"),
        (4, "bad_cbor"),
    ]
    assert "0x-hex of a pot1 call spelled as text" in block.ignored[1].detail


def test_failed_and_interrupted_extrinsics_do_not_count(pair, chopsticks, caplog):  # noqa: F811
    a, b = pair
    key = unique_key("raw")
    signer = load_key(key, ss58_format=a.client.ss58_format).ss58_address
    chopsticks.fund([signer])
    first, second = encode_call(_commit(1)), encode_call(_commit(2))

    def remark(si, data):
        return si.compose_call("System", "remark_with_event", {"remark": data})

    def bad(si):  # root-only: dispatch fails with BadOrigin
        return si.compose_call("System", "set_heap_pages", {"pages": 1})

    si = SubstrateInterface(url=chopsticks.url, auto_reconnect=False, ws_options={"timeout": 30})
    with si, caplog.at_level(logging.INFO, logger="chain.substrate"):
        n_all = _raw_submit(
            chopsticks,
            si,
            key,
            lambda si: si.compose_call("Utility", "batch_all", {"calls": [remark(si, first), bad(si)]}),
        )
        assert a.block(n_all).calls == ()
        assert "the extrinsic failed" in caplog.text
        n_batch = _raw_submit(
            chopsticks,
            si,
            key,
            lambda si: si.compose_call(
                "Utility", "batch", {"calls": [remark(si, first), bad(si), remark(si, second)]}
            ),
        )
        assert a.block(n_batch).calls == ((signer, _commit(1)),)
        assert "did not execute" in caplog.text
        # A plain System.remark is not a protocol carrier; remark_with_event inside nested batches is.
        n_nested = _raw_submit(
            chopsticks,
            si,
            key,
            lambda si: si.compose_call(
                "Utility",
                "batch",
                {
                    "calls": [
                        si.compose_call("System", "remark", {"remark": first}),
                        si.compose_call("Utility", "batch_all", {"calls": [remark(si, second)]}),
                    ]
                },
            ),
        )
        assert a.block(n_nested).calls == ((signer, _commit(2)),)
        assert "skipped System.remark" in caplog.text


def test_submit_without_wait_then_follow(pair):
    a, b = pair
    start = a.finalized_head()
    receipt = a.submit([_commit(3)], wait=False)
    assert receipt.block_number is None and len(receipt.tx_hash) == 32
    seen = []
    deadline = time.monotonic() + 30
    for block in b.follow(start, poll=0.05, stop=lambda: bool(seen) and seen[-1].calls):
        seen.append(block)
        assert time.monotonic() < deadline, "the remark never reached a finalized block"
    assert [blk.number for blk in seen] == list(range(start + 1, start + 1 + len(seen)))
    assert seen[-1].calls == ((a.account, _commit(3)),)


def test_two_transports_same_key_share_nonces(chopsticks):  # noqa: F811
    fresh_chain(chopsticks)
    key = unique_key("twin")
    t1 = connect_substrate(chopsticks.url, key)
    t2 = connect_substrate(chopsticks.url, key)
    try:
        chopsticks.fund([t1.account])
        numbers = [t.submit([_commit(i)]).block_number for i, t in enumerate([t1, t2, t1, t2], start=1)]
        assert numbers == sorted(numbers) and len(set(numbers)) == 4
        assert [t1.block(n).calls for n in numbers] == [((t1.account, _commit(i)),) for i in range(1, 5)]
    finally:
        t1.close()
        t2.close()


def test_unfunded_account_is_refused_clearly(chopsticks):  # noqa: F811
    t = connect_substrate(chopsticks.url, unique_key("poor"))
    try:
        with pytest.raises(TransportError, match="rejected the extrinsic"):
            t.submit([_commit(1)], timeout=20)
    finally:
        t.close()


def test_submit_payloads_sends_exact_bytes_and_refuses_non_calls(pair):
    a, b = pair
    payload = encode_call(_commit(7))
    r = a.submit_payloads([payload, payload])
    assert b.block(r.block_number).calls == ((a.account, _commit(7)), (a.account, _commit(7)))
    with pytest.raises(TransportError, match="payload 1 is not a protocol call"):
        a.submit_payloads([payload, b"pot1junk"])


def test_unfinalized_block_is_refused(pair):
    a, _ = pair
    head = a.finalized_head()
    with pytest.raises(TransportError, match="not finalized yet"):
        a.block(head + 5)


def test_bad_calls_refused_before_submission(pair):
    a, _ = pair
    with pytest.raises(TransportError, match="at least one"):
        a.submit([])
    with pytest.raises(TransportError, match="cannot be encoded"):
        a.submit(["not a call"])


def test_make_network_gives_fresh_funded_chain(chopsticks):  # noqa: F811
    net = make_network(ProtocolParams())
    try:
        base = net.node.head()[0]
        accounts = {net.transport(n).account for n in ACCOUNTS}
        assert len(accounts) == len(ACCOUNTS)
        assert all(isinstance(net.transport(n), RemarkTransport) for n in ACCOUNTS)
        r = net.submit("v1", _commit(5))
        assert r.block_number == base + 1
        assert net.advance(3) == base + 4
        assert net.transport("v4").block(base + 1).calls == ((net.transport("v1").account, _commit(5)),)
        with pytest.raises(KeyError, match="no account"):
            net.transport("v9")
    finally:
        net.close()
    again = make_network(ProtocolParams())
    try:
        assert again.node.head()[0] == base  # rewound: the previous network's blocks are gone
        assert again.transport("miner").block(base).calls == ()
    finally:
        again.close()


def test_rapid_submissions_without_waiting_all_land(chopsticks):  # noqa: F811
    # A verifier sends several reveals back to back without awaiting each: every one must get its
    # own nonce and land, even while the node has not yet built the block of the one before.
    fresh_chain(chopsticks)
    t = connect_substrate(chopsticks.url, unique_key("rapid"))
    try:
        chopsticks.fund([t.account])
        start = t.finalized_head()
        for i in range(1, 6):
            t.submit([_commit(i)], wait=False)
        deadline = time.monotonic() + 60
        seen: list = []
        cursor = start
        while time.monotonic() < deadline and len(seen) < 5:
            head = t.finalized_head()
            while cursor < head:
                cursor += 1
                seen += [c for _, c in t.block(cursor).calls]
            time.sleep(0.3)
        assert sorted(seen, key=lambda c: c.commitment) == [_commit(i) for i in range(1, 6)]
    finally:
        t.close()
