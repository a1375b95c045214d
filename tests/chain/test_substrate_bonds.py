"""Money on Substrate: the keyless bond account, the funding rule for bonds and run registrations
(the miner's stake and the verification escrow) on decoded events and extrinsics under the
network's parameters, and (on chopsticks) paid, bare, short and misdirected bonds and
registrations through the remark transport, with the bond account's balance read from
System.Account, and a configure_network record changing planck_per_unit from its block on."""

from __future__ import annotations

import pytest
from scalecodec.utils.ss58 import ss58_encode

from chain.calls import (
    MAX_DETAIL,
    BondVerifier,
    CommitWitness,
    ConfigureNetwork,
    Ignored,
    UnbondVerifier,
    encode_call,
)
from chain.protocol.cost import replay_cost, run_escrow
from chain.protocol.events import ParamsEffective, RemarkIgnored, RunRegistered, VerifierBonded
from chain.protocol.params import ProtocolParams
from chain.protocol.state import new_state
from chain.substrate import BOND_ACCOUNT, PLANCK_PER_UNIT, TransportError, bond_address, connect_substrate
from chain.substrate.blocks import Executed, _record_event
from chain.substrate.bonds import (
    MAX_BALANCE,
    BondError,
    bond_planck,
    funded_label,
    funded_units,
    funding_shortfall,
)
from chain.substrate.remark import assemble, read_extrinsic
from chain.substrate.scale import blake2_256
from chain.view import ChainView
from tests.chain.chopsticks_env import Chopsticks, chopsticks, fresh_chain, unique_key  # noqa: F401
from tests.chain.runs import SyntheticRun

CID = bytes(range(32))
ALICE = bytes([1]) * 32
BOB = bytes([2]) * 32
P = PLANCK_PER_UNIT
DEFAULTS = ProtocolParams()


def _run_units(call, params: ProtocolParams = DEFAULTS) -> int:
    """What a registration carries, computed here from the protocol's own cost functions."""
    blocks = replay_cost(SyntheticRun().spec, params).blocks
    return params.miner_stake + run_escrow(blocks, params)[1]


def _commit(i: int) -> CommitWitness:
    return CommitWitness(challenge_id=CID, commitment=bytes([i]) * 32)


# --- the bond account --------------------------------------------------------------------------


def test_bond_account_is_the_pallet_id_account_of_pot_bond():
    assert BOND_ACCOUNT == b"modlpot/bond" + bytes(20)
    assert len(BOND_ACCOUNT) == 32
    assert bond_address(2) == "F3opxRbMdwSkQsia8Qct99UE7krfwtDNVg8BMVMAN8mnkM2"
    assert bond_address(42) == bond_address(None) == "5EYCAe5ijGvWzm4GoRbZzBnU5XUcsH52v7qNnhDPgZvH3dvv"


def test_nobody_can_hold_a_key_for_the_bond_account():
    p = 2**255 - 19
    # sr25519: RFC 9496 decoding refuses an encoding whose integer is odd ("negative") or >= p.
    s = int.from_bytes(BOND_ACCOUNT, "little")
    assert s % 2 == 1 or s >= p
    # ed25519: the bytes are y (255 bits) and x's sign; no x with x^2 = (y^2 - 1) / (d y^2 + 1).
    d = -121665 * pow(121666, -1, p) % p
    y = s & ((1 << 255) - 1)
    x2 = (y * y - 1) * pow(d * y * y + 1, -1, p) % p
    assert x2 != 0 and pow(x2, (p - 1) // 2, p) == p - 1  # a non-residue: no such point


def test_payment_totals_are_checked():
    assert P == DEFAULTS.planck_per_unit == 10**10  # the parameter's default is the documented value
    assert bond_planck([1, 2], P) == 3 * P and bond_planck([], P) == 0
    assert bond_planck([2**64 - 1], 2**64) == (2**64 - 1) * 2**64 <= MAX_BALANCE
    with pytest.raises(BondError, match="exceed a u128"):
        bond_planck([2**63, 2**63], 2**64)  # 2**128: one planck past a u128


def test_planck_per_unit_is_no_transport_option():
    # Port 1 has no node: the option is refused before any connection is tried, on both kinds.
    for kind in ("remark", "pallet"):
        with pytest.raises(
            TransportError, match="planck_per_unit is no transport option: it is the network's"
        ):
            connect_substrate("ws://127.0.0.1:1", "//Alice", kind=kind, planck_per_unit=P)


# --- what a funded call carries ------------------------------------------------------------------


def test_a_registration_carries_the_miner_stake_and_the_escrow_under_the_params_in_force():
    reg = SyntheticRun(miner=ss58_encode(ALICE, 2)).register()
    assert funded_units(BondVerifier(amount=7), DEFAULTS) == 7
    units = funded_units(reg, DEFAULTS)
    assert units == _run_units(reg) and units > DEFAULTS.miner_stake  # the escrow is not nothing
    # Both halves follow the parameters: the stake, and the fee the escrow is made of.
    dearer = ProtocolParams(miner_stake=3000, fee_per_replay_block=5)
    assert funded_units(reg, dearer) == _run_units(reg, dearer) == 3000 + run_escrow(
        replay_cost(SyntheticRun().spec, dearer).blocks, dearer)[1]
    label = funded_label(reg, DEFAULTS)
    assert (
        label == f"start_training_commitment(run {reg.run_id.hex()[:8]}, stake 1000 + escrow {units - 1000})"
    )
    # A registration the protocol refuses before any money moves carries nothing; nor do other calls.
    assert funded_units(SyntheticRun().register(spec=b"\x01"), DEFAULTS) is None
    assert funded_units(SyntheticRun().register(spec=b"\x00" * 20_000), DEFAULTS) is None
    assert funded_units(UnbondVerifier(amount=3), DEFAULTS) is None
    assert funded_units(_commit(1), DEFAULTS) is None


# --- the funding rule --------------------------------------------------------------------------


def test_funding_rule_counts_the_signers_transfers_into_the_bond_account():
    assert funding_shortfall(ALICE, [(ALICE, BOND_ACCOUNT, 5 * P)], [5], planck_per_unit=P) is None
    assert funding_shortfall(ALICE, [(ALICE, BOND_ACCOUNT, 6 * P)], [5], planck_per_unit=P) is None
    # Several transfers add up; several bonds need their sum.
    two = [(ALICE, BOND_ACCOUNT, 2 * P), (ALICE, BOND_ACCOUNT, 3 * P)]
    assert funding_shortfall(ALICE, two, [1, 4], planck_per_unit=P) is None
    short = funding_shortfall(ALICE, two, [1, 5], planck_per_unit=P)
    assert short == (
        "amount short: 2 bonds summing to 6 units need 60000000000 planck (10000000000 per unit); "
        "the signer paid 50000000000 planck into the bond account"
    )
    # One planck short is short.
    one = funding_shortfall(ALICE, [(ALICE, BOND_ACCOUNT, 5 * P - 1)], [5], planck_per_unit=P)
    assert one.startswith(
        "amount short: bond_verifier(amount=5) needs 50000000000 planck (10000000000 per unit)"
    )
    assert one.endswith("the signer paid 49999999999 planck into the bond account")
    # The unit follows the network's setting.
    assert funding_shortfall(ALICE, [(ALICE, BOND_ACCOUNT, 10)], [5], planck_per_unit=2) is None


def test_funding_rule_names_what_is_missing():
    none = funding_shortfall(ALICE, [], [3], planck_per_unit=P, ss58_format=2)
    assert none == (
        f"no transfer: bond_verifier(amount=3) needs {3 * P} planck ({P} per unit) into "
        f"{bond_address(2)}; none from the signer in this extrinsic"
    )
    # Someone else paying into the bond account pays for nobody's bond but their own.
    other = funding_shortfall(ALICE, [(BOB, BOND_ACCOUNT, 9 * P)], [3], planck_per_unit=P)
    assert other.startswith("no transfer:")
    wrong = funding_shortfall(ALICE, [(ALICE, BOB, 9 * P)], [3], planck_per_unit=P, ss58_format=2)
    assert wrong.startswith(f"wrong destination: bond_verifier(amount=3) needs {3 * P} planck")
    assert wrong.endswith(f"the signer paid {ss58_encode(BOB, 2)}, not the bond account")
    # A partial payment to the right place is "short", whatever else went elsewhere.
    assert funding_shortfall(ALICE, [(ALICE, BOB, 9 * P), (ALICE, BOND_ACCOUNT, P)], [3],
                             planck_per_unit=P).startswith("amount short:")


def test_the_longest_detail_fits_an_ignored_record():
    big = [2**64 - 1, 2**64 - 1]
    # A registration of a million-unit stake and a ten-million-unit escrow at 10**12 planck a unit.
    run = "start_training_commitment(run 01234567, stake 1000000 + escrow 10000000)"
    for transfers in ([], [(ALICE, BOB, 1)], [(ALICE, BOND_ACCOUNT, 1)]):
        for amounts, labels, unit in (
            ([2**64 - 1], None, 2**64),
            (big, None, 2**64),
            ([11_000_000], [run], 10**12),
        ):
            detail = funding_shortfall(ALICE, transfers, amounts, planck_per_unit=unit, ss58_format=2,
                                       labels=labels)
            assert len(detail) <= MAX_DETAIL, detail
    # Past that, the record cuts it: a detail is bounded whatever the numbers.
    huge = run.replace("1000000", str(2**48)).replace("10000000", str(2**48))
    detail = funding_shortfall(ALICE, [], [2**49], planck_per_unit=2**63 - 1, ss58_format=2, labels=[huge])
    assert len(detail) > MAX_DETAIL
    assert len(Ignored.of(0, "a", b"x", "unfunded_run", detail).detail) == MAX_DETAIL


# --- events and extrinsics, as decoded from a block --------------------------------------------


def _event(idx, module, name, attrs):
    return {"phase": "ApplyExtrinsic", "extrinsic_idx": idx, "module_id": module, "event_id": name,
            "attributes": attrs}


def test_transfer_events_are_recorded_per_extrinsic():
    alice, bond = ss58_encode(ALICE, 2), bond_address(2)
    outcome: dict[int, Executed] = {}
    for ev in [
        _event(2, "Balances", "Withdraw", {"who": alice, "amount": 6656082}),  # the fee: not a transfer
        _event(2, "Balances", "Transfer", {"from": alice, "to": bond, "amount": 3 * P}),
        _event(2, "Balances", "Transfer", {"from": "0x" + ALICE.hex(), "to": "0x" + BOB.hex(), "amount": 7}),
        _event(3, "Balances", "Transfer", {"from": alice, "to": bond, "amount": P}),
        _event(3, "Balances", "Transfer", {"from": alice, "to": bond}),  # no amount: skipped
        _event(3, "Balances", "Transfer", {"from": alice, "to": bond, "amount": -1}),
        _event(3, "Balances", "Transfer", {"from": alice, "to": "nonsense", "amount": 1}),
        {"phase": "Finalization", "module_id": "Balances", "event_id": "Transfer",
         "attributes": {"from": alice, "to": bond, "amount": P}},
    ]:
        _record_event(ev, outcome)
    assert outcome[2].transfers == [(ALICE, BOND_ACCOUNT, 3 * P), (ALICE, BOB, 7)]
    assert outcome[3].transfers == [(ALICE, BOND_ACCOUNT, P)]
    assert set(outcome) == {2, 3}


def _remark(payload: bytes) -> dict:
    return {"module": "System", "function": "remark_with_event", "remark": payload, "inner": []}


def _batch(*calls: dict) -> dict:
    return {"module": "Utility", "function": "batch_all", "inner": list(calls)}


def _transfer_call() -> dict:
    return {"module": "Balances", "function": "transfer_keep_alive", "inner": []}


def _read(calls, transfers, *, signer=ALICE, position=0, params=DEFAULTS):
    """(calls, ignored, next position) of one executed extrinsic of `calls` whose events show these
    transfers, decided under `params` (None: before the parameters are known)."""
    payloads = [c["remark"] for c in calls if "remark" in c]
    ex = Executed(
        success=True, remarks=[(signer, blake2_256(p)) for p in payloads], transfers=list(transfers)
    )
    ext = {"address": ss58_encode(signer, 2), "call": _batch(_transfer_call(), *calls)}
    pos = [position]
    remarks = read_extrinsic(ext, ex, "block 1 extrinsic 2", pos, ss58_format=2, extrinsic=2)
    out_calls, ignored = assemble(remarks, params, 2, 1)
    return out_calls, ignored, pos[0]


def test_a_paid_bond_is_a_call():
    bond = BondVerifier(amount=4)
    calls, ignored, _ = _read([_remark(encode_call(bond))], [(ALICE, BOND_ACCOUNT, 4 * P)])
    assert calls == [(ss58_encode(ALICE, 2), bond)] and ignored == []


def test_an_unpaid_bond_is_ignored_and_the_rest_of_the_extrinsic_counts():
    alice = ss58_encode(ALICE, 2)
    payloads = [encode_call(_commit(1)), encode_call(BondVerifier(amount=4)), b"hello",
                encode_call(UnbondVerifier(amount=2))]
    calls, ignored, end = _read([_remark(p) for p in payloads], [], position=10)
    assert calls == [(alice, _commit(1)), (alice, UnbondVerifier(amount=2))]
    [ig] = ignored
    assert (ig.position, ig.origin, ig.reason, ig.size) == (11, alice, "unfunded_bond", len(payloads[1]))
    assert ig.detail.startswith("no transfer: bond_verifier(amount=4) needs 40000000000 planck")
    assert end == 14  # every executed remark took a position, the foreign one too


def test_bonds_of_one_extrinsic_are_paid_together_or_not_at_all():
    b1, b2 = BondVerifier(amount=1), BondVerifier(amount=2)
    remarks = [_remark(encode_call(b1)), _remark(encode_call(b2))]
    calls, ignored, _ = _read(remarks, [(ALICE, BOND_ACCOUNT, 3 * P)])
    assert [c for _, c in calls] == [b1, b2] and ignored == []
    # Enough for the first alone is not enough: both are ignored, each with the same detail.
    calls, ignored, _ = _read(remarks, [(ALICE, BOND_ACCOUNT, 2 * P)])
    assert calls == []
    assert [(ig.position, ig.reason) for ig in ignored] == [(0, "unfunded_bond"), (1, "unfunded_bond")]
    assert ignored[0].detail == ignored[1].detail
    assert ignored[0].detail.startswith("amount short: 2 bonds summing to 3 units need")


def test_a_transfer_to_another_account_or_from_another_signer_pays_nothing():
    remark = [_remark(encode_call(BondVerifier(amount=1)))]
    _, ignored, _ = _read(remark, [(ALICE, BOB, 5 * P)])
    assert ignored[0].detail.startswith("wrong destination:")
    _, ignored, _ = _read(remark, [(BOB, BOND_ACCOUNT, 5 * P)])
    assert ignored[0].detail.startswith("no transfer:")


def test_a_failed_extrinsic_carries_no_bond():
    payload = encode_call(BondVerifier(amount=1))
    ex = Executed(success=False, failure={"module": "Utility"}, transfers=[(ALICE, BOND_ACCOUNT, P)])
    assert read_extrinsic({"address": ss58_encode(ALICE, 2), "call": _batch(_remark(payload))}, ex, "b", [0],
                          ss58_format=2) == []


def test_the_payment_is_checked_under_the_params_given():
    alice, bond = ss58_encode(ALICE, 2), BondVerifier(amount=4)
    remarks = [_remark(encode_call(_commit(1))), _remark(encode_call(bond))]
    paid = [(ALICE, BOND_ACCOUNT, 4 * P)]
    # Before the parameters are known the funded call is undecided: left out, the rest counts.
    calls, ignored, _ = _read(remarks, paid, params=None)
    assert calls == [(alice, _commit(1))] and ignored == []
    assert _read(remarks, paid)[0] == [(alice, _commit(1)), (alice, bond)]
    # The same payment under a dearer unit is short, and the detail names the unit in force.
    calls, ignored, _ = _read(remarks, paid, params=ProtocolParams(planck_per_unit=10 * P))
    assert calls == [(alice, _commit(1))]
    assert ignored[0].reason == "unfunded_bond"
    assert ignored[0].detail == (
        f"amount short: bond_verifier(amount=4) needs {40 * P} planck ({10 * P} per unit); "
        f"the signer paid {4 * P} planck into the bond account"
    )


def test_a_registration_must_carry_its_stake_and_escrow():
    alice = ss58_encode(ALICE, 2)
    reg = SyntheticRun(miner=alice).register()
    need = _run_units(reg) * P
    remark = [_remark(encode_call(reg))]
    assert _read(remark, [(ALICE, BOND_ACCOUNT, need)])[:2] == ([(alice, reg)], [])
    calls, ignored, _ = _read(remark, [(ALICE, BOND_ACCOUNT, need - 1)])
    assert calls == []
    [ig] = ignored
    assert (ig.position, ig.reason) == (0, "unfunded_run")
    assert ig.detail == (f"amount short: {funded_label(reg, DEFAULTS)} needs {need} planck ({P} per unit); "
                         f"the signer paid {need - 1} planck into the bond account")
    _, ignored, _ = _read(remark, [])
    assert ignored[0].detail.startswith(
        f"no transfer: start_training_commitment(run {reg.run_id.hex()[:8]}, stake"
    )
    # A registration whose spec the protocol refuses needs nothing here: the protocol refuses it.
    bad = SyntheticRun(miner=alice).register(spec=b"\x01")
    assert _read([_remark(encode_call(bad))], [])[:2] == ([(alice, bad)], [])


def test_a_bond_and_a_registration_of_one_extrinsic_are_paid_together_or_not_at_all():
    alice = ss58_encode(ALICE, 2)
    reg, bond = SyntheticRun(miner=alice).register(), BondVerifier(amount=100)
    remarks = [_remark(encode_call(bond)), _remark(encode_call(reg))]
    need = (100 + _run_units(reg)) * P
    assert [c for _, c in _read(remarks, [(ALICE, BOND_ACCOUNT, need)])[0]] == [bond, reg]
    calls, ignored, _ = _read(remarks, [(ALICE, BOND_ACCOUNT, need - P)])
    assert calls == [] and [(ig.position, ig.reason) for ig in ignored] == [
        (0, "unfunded_bond"),
        (1, "unfunded_run"),
    ]
    assert ignored[0].detail == ignored[1].detail
    assert ignored[0].detail.startswith(f"amount short: 2 funded calls (bonds, run registrations) summing to "
                                        f"{need // P} units need {need} planck")


# --- on a real runtime -------------------------------------------------------------------------


@pytest.fixture
def pair(chopsticks: Chopsticks):  # noqa: F811
    """Two funded remark transports on a fresh chain."""
    fresh_chain(chopsticks)
    a = connect_substrate(chopsticks.url, unique_key("bond-a"), kind="remark")
    b = connect_substrate(chopsticks.url, unique_key("bond-b"), kind="remark")
    chopsticks.fund([a.account, b.account])
    yield a, b
    a.close()
    b.close()


def _free(t, address: str, number: int) -> int:
    """The free balance of `address` after block `number`, read from System.Account."""
    block_hash = t.client.rpc("chain_getBlockHash", [number])
    info = t.client.call(
        "read System.Account", lambda si: si.query("System", "Account", [address], block_hash=block_hash)
    )
    return int(info.value["data"]["free"])


def _send_batch(t, build) -> int:
    """Sign `Utility.batch_all(build(si))` with transport `t`'s key; return the block it landed in."""
    receipt = t._submit_composed(
        lambda si: si.compose_call("Utility", "batch_all", {"calls": build(si)}), wait=True, timeout=60
    )
    return receipt.block_number


def _remark_call(si, payload: bytes):
    return si.compose_call("System", "remark_with_event", {"remark": payload})


def _pay(si, planck: int):
    return si.compose_call(
        "Balances", "transfer_keep_alive", {"dest": "0x" + BOND_ACCOUNT.hex(), "value": planck}
    )


def _settled(t, number: int, params: ProtocolParams = DEFAULTS):
    """Block `number` as read by `t` and settled under `params` (what a chain view applies)."""
    return t.settle(t.block(number), new_state(params))


@pytest.mark.chopsticks
def test_a_bond_submitted_through_the_transport_is_paid_and_counts(pair):
    a, b = pair
    assert a.bond_account == bond_address(2) == b.bond_account
    before = a.finalized_head()
    start = _free(a, a.bond_account, before)
    calls = [BondVerifier(amount=3), _commit(1), BondVerifier(amount=2)]
    receipt = a.submit(calls)
    # Read, the block leaves its funded calls to the parameters; settled, they count.
    assert b.block(receipt.block_number).calls == ((a.account, _commit(1)),)
    block = _settled(b, receipt.block_number)  # any node sees the same
    assert block.calls == tuple((a.account, c) for c in calls) and block.ignored == ()
    assert _free(a, a.bond_account, receipt.block_number) - start == 5 * P
    # A bond re-sent from a journal (submit_payloads) is paid the same way.
    again = a.submit_payloads([encode_call(BondVerifier(amount=1))])
    assert _settled(b, again.block_number).calls == ((a.account, BondVerifier(amount=1)),)
    assert _free(a, a.bond_account, again.block_number) - start == 6 * P
    # Unbonding is a plain remark: nothing comes back from the keyless account.
    out = a.submit([UnbondVerifier(amount=6)])
    assert b.block(out.block_number).calls == ((a.account, UnbondVerifier(amount=6)),)
    assert _free(a, a.bond_account, out.block_number) - start == 6 * P


@pytest.mark.chopsticks
def test_a_bare_bond_remark_is_ignored_as_unfunded(pair):
    a, b = pair
    payload = encode_call(BondVerifier(amount=3))
    start = _free(a, a.bond_account, a.finalized_head())
    receipt = a.submit_remarks([payload, encode_call(_commit(2))])
    block = _settled(b, receipt.block_number)
    assert block.calls == ((a.account, _commit(2)),)
    [ig] = block.ignored
    assert (ig.position, ig.origin, ig.reason, ig.size) == (0, a.account, "unfunded_bond", len(payload))
    assert ig.detail == (
        f"no transfer: bond_verifier(amount=3) needs {3 * P} planck ({P} per unit) into "
        f"{a.bond_account}; none from the signer in this extrinsic"
    )
    assert _free(a, a.bond_account, receipt.block_number) == start


@pytest.mark.chopsticks
def test_a_short_or_misdirected_transfer_does_not_fund_the_bond(pair):
    a, b = pair
    payload = encode_call(BondVerifier(amount=2))
    start = _free(a, a.bond_account, a.finalized_head())
    short = _send_batch(a, lambda si: [_pay(si, 2 * P - 1), _remark_call(si, payload)])
    block = _settled(b, short)
    assert block.calls == ()
    [ig] = block.ignored
    assert ig.reason == "unfunded_bond"
    assert ig.detail == (
        f"amount short: bond_verifier(amount=2) needs {2 * P} planck ({P} per unit); "
        f"the signer paid {2 * P - 1} planck into the bond account"
    )
    # The short transfer did move value; it just paid for no bond.
    assert _free(a, a.bond_account, short) - start == 2 * P - 1
    wrong = _send_batch(a, lambda si: [
        si.compose_call("Balances", "transfer_keep_alive", {"dest": b.account, "value": 2 * P}),
        _remark_call(si, payload),
    ])
    block = _settled(b, wrong)
    assert block.calls == () and block.ignored[0].reason == "unfunded_bond"
    assert block.ignored[0].detail.endswith(f"the signer paid {b.account}, not the bond account")
    # Two transfers covering the bond together do fund it (the rule sums the extrinsic's transfers).
    split = _send_batch(a, lambda si: [_pay(si, P), _remark_call(si, payload), _pay(si, P)])
    assert _settled(b, split).calls == ((a.account, BondVerifier(amount=2)),)


@pytest.mark.chopsticks
def test_a_registration_carries_the_miner_stake_and_escrow_and_counts(pair, chopsticks: Chopsticks):  # noqa: F811
    a, b = pair
    base = a.finalized_head()
    view = ChainView(b, DEFAULTS, cursor=base)
    reg = SyntheticRun(miner=a.account, seed="funded").register()
    need = _run_units(reg) * P
    start = _free(a, a.bond_account, base)
    receipt = a.submit([reg])
    assert _free(a, a.bond_account, receipt.block_number) - start == need  # exactly stake + escrow
    events = view.sync()
    [registered] = [e for e in events if isinstance(e, RunRegistered)]
    assert (registered.run_id, registered.miner, registered.stake) == (
        reg.run_id,
        a.account,
        DEFAULTS.miner_stake,
    )
    assert DEFAULTS.miner_stake + registered.escrow == _run_units(reg)
    assert not [e for e in events if isinstance(e, RemarkIgnored)]


@pytest.mark.chopsticks
def test_an_unfunded_or_underfunded_registration_is_ignored_with_the_reason(pair):
    a, b = pair
    view = ChainView(b, DEFAULTS, cursor=a.finalized_head())
    bare = SyntheticRun(miner=a.account, seed="bare").register()
    short = SyntheticRun(miner=a.account, seed="short").register()
    need = _run_units(short) * P
    n_bare = a.submit_remarks([encode_call(bare)]).block_number
    n_short = _send_batch(a, lambda si: [_pay(si, need - 1), _remark_call(si, encode_call(short))])
    events = view.sync()
    assert not [e for e in events if isinstance(e, RunRegistered)] and view.state.runs == {}
    ignored = {e.block: e for e in events if isinstance(e, RemarkIgnored)}
    assert (ignored[n_bare].reason, ignored[n_short].reason) == ("unfunded_run", "unfunded_run")
    assert ignored[n_bare].detail == (
        f"no transfer: {funded_label(bare, DEFAULTS)} needs {need} planck ({P} per unit) into "
        f"{a.bond_account}; none from the signer in this extrinsic")
    assert ignored[n_short].detail == (
        f"amount short: {funded_label(short, DEFAULTS)} needs {need} planck ({P} per unit); "
        f"the signer paid {need - 1} planck into the bond account")
    assert ignored[n_short].origin == a.account and ignored[n_short].message.startswith(
        "a start_training_commitment"
    )


@pytest.mark.chopsticks
def test_a_registration_the_account_cannot_pay_is_refused_before_sending(chopsticks: Chopsticks):  # noqa: F811
    fresh_chain(chopsticks)
    t = connect_substrate(chopsticks.url, unique_key("poor-miner"))
    try:
        chopsticks.fund([t.account], amount=10**12)  # fees, but nowhere near stake and escrow
        reg = SyntheticRun(miner=t.account, seed="poor").register()
        head = t.finalized_head()
        with pytest.raises(
            TransportError, match=r"cannot pay for start_training_commitment\(run .* planck short"
        ):
            t.submit([reg])
        assert t.finalized_head() == head and t._chain_next_nonce() == 0  # nothing was sent
    finally:
        t.close()


@pytest.mark.chopsticks
def test_planck_per_unit_follows_the_network_record_from_its_effective_block(pair, chopsticks: Chopsticks):  # noqa: F811
    a, b = pair  # a configures the network (the first record names its authority); b bonds
    dear = ProtocolParams(planck_per_unit=10 * P)
    view = ChainView(b, DEFAULTS, cursor=a.finalized_head())
    record = a.submit([ConfigureNetwork(params=dear.to_cbor(), effective_block=a.finalized_head() + 4)])
    effective = record.block_number + 3
    # Before the record takes effect a bond carries 10**10 planck a unit, and that counts.
    early = _send_batch(
        b, lambda si: [_pay(si, 100 * P), _remark_call(si, encode_call(BondVerifier(amount=100)))]
    )
    assert early < effective
    chopsticks.new_blocks(effective - b.finalized_head())
    # From its block on, the same payment is short, under the record's unit.
    late = _send_batch(
        b, lambda si: [_pay(si, 100 * P), _remark_call(si, encode_call(BondVerifier(amount=100)))]
    )
    events = view.sync()
    assert [e.block for e in events if isinstance(e, ParamsEffective)] == [effective]
    assert [(e.block, e.amount) for e in events if isinstance(e, VerifierBonded)] == [(early, 100)]
    [ig] = [e for e in events if isinstance(e, RemarkIgnored)]
    assert (ig.block, ig.reason) == (late, "unfunded_bond")
    assert ig.detail == (
        f"amount short: bond_verifier(amount=100) needs {1000 * P} planck ({10 * P} per unit); "
        f"the signer paid {100 * P} planck into the bond account"
    )
    # The transport pays what the record says: it read the parameters from the view it serves.
    start = _free(b, b.bond_account, late)
    paid = b.submit([BondVerifier(amount=100)])
    assert _free(b, b.bond_account, paid.block_number) - start == 1000 * P
    assert [(e.block, e.amount) for e in view.sync() if isinstance(e, VerifierBonded)] == [
        (paid.block_number, 100)
    ]
    # A transport no view has served reads them from the chain's records.
    fresh = connect_substrate(chopsticks.url, unique_key("bond-late"))
    try:
        chopsticks.fund([fresh.account])
        assert fresh.submit_params()[0].planck_per_unit == 10 * P
    finally:
        fresh.close()
