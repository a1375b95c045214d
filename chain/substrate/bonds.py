"""Money on Substrate chains: the protocol's keyless bond account and the funding rule for the
calls that move value, a verifier's bond and a run's registration (the miner's stake and the
verification escrow).

On the dev chain both are accounting only. On a Substrate remark chain they must be paid for in
the chain's own currency, in a way every node can check from the block alone:

What a call must carry (`funded_units`, in protocol units, under the parameters in force at its
block): `bond_verifier(amount)` carries `amount`; `start_training_commitment` carries
`miner_stake + escrow`, the escrow being `chain.protocol.cost.run_escrow(replay_cost(spec).blocks)`
of the registration's own spec (a registration whose spec is unusable carries nothing: the
protocol refuses it). x `planck_per_unit` (a parameter of the on-chain record) gives planck.

The rule. Such a remark counts only if the same extrinsic carries successful balance transfers
from the extrinsic's signer into the bond account (`BOND_ACCOUNT`) totalling at least what its
funded calls carry x planck_per_unit planck, as shown by that extrinsic's `Balances.Transfer`
events (`from`, `to`, `amount`). Several funded remarks in one extrinsic need transfers that cover
their sum; when they do not, none of them counts (all or nothing, so no ordering question arises).
Transfers count for their own extrinsic only, never for another one. Transfers from any other
account, or to any other account, fund nothing. A remark that fails the rule becomes an
`Ignored` record with reason "unfunded_bond" (a bond) or "unfunded_run" (a registration) and a
detail naming what was missing (no transfer, a wrong destination, or the amount short, with the
numbers); the protocol never sees the call.

The events are the evidence, not the call tree: a `Balances.Transfer` event exists only for a
transfer that executed (a failed batch item's events are rolled back with it, and a failed
extrinsic's remarks count for nothing anyway), whatever call made it (`transfer_keep_alive`,
`transfer_allow_death`, `transfer`, `transfer_all`, nested in a batch or not).

The bond account. Its 32-byte account id is

    b"modl" + b"pot/bond" + 20 zero bytes

which is exactly how Substrate names the account of a pallet with `PalletId(*b"pot/bond")`
(`into_account_truncating`: the type id b"modl", the 8-byte id, zero padding), so a future native
PoT pallet with that id would own the same account. No hash is involved, and nobody holds a key
for it: as an sr25519 key it is no canonical Ristretto255 encoding (its first byte, b"m" = 0x6d,
is odd, i.e. "negative", which RFC 9496 decoding rejects), as an ed25519 key it is no point of the
curve (y = the bytes little-endian gives no square x^2), and an ECDSA account id is the BLAKE2-256
of a public key, so a key for it would need a BLAKE2 preimage. Value sent there stays there.

Its SS58 address depends on the chain's prefix (`bond_address(ss58_format)`); on the chopsticks
Asset Hub (prefix 2) it is F3opxRbMdwSkQsia8Qct99UE7krfwtDNVg8BMVMAN8mnkM2, with the generic
prefix 42 5EYCAe5ijGvWzm4GoRbZzBnU5XUcsH52v7qNnhDPgZvH3dvv.

Units. `planck_per_unit` converts protocol units into the chain's smallest currency unit. It is
the network's parameter (`ProtocolParams.planck_per_unit`, set by `configure_network` records
like every other, default `PLANCK_PER_UNIT` = 10**10), never a node setting: a block's funded
calls are checked under the parameters in force at that block (`RemarkTransport.settle`).

Releases. A remark-only chain cannot give value back from a keyless account: nothing is ever
transferred back. `unbond_verifier` is carried as a plain remark, and the miner's stake and what
is left of the escrow when a run settles (`RunSettled`) are released in the protocol's own
accounting; the planck stay in the bond account.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from scalecodec.utils.ss58 import ss58_encode

from chain.calls import BondVerifier, StartTrainingCommitment
from chain.protocol.cost import replay_cost, run_escrow
from chain.protocol.params import MAX_SPEC_BYTES, ProtocolParams
from commitments.errors import CommitmentError
from commitments.spec import Spec

PALLET_TYPE_ID = b"modl"
BOND_PALLET_ID = b"pot/bond"
BOND_ACCOUNT: bytes = (PALLET_TYPE_ID + BOND_PALLET_ID).ljust(32, b"\x00")
PLANCK_PER_UNIT = ProtocolParams().planck_per_unit  # the parameter's default: 10**10
MAX_BALANCE = 2**128 - 1  # Substrate balances are u128

# The balance calls `submit` may compose, in order of preference; the first the runtime has wins.
TRANSFER_CALLS = ("transfer_keep_alive", "transfer_allow_death", "transfer")

Transfer = tuple[bytes, bytes, int]  # (from account id, to account id, planck)

# The calls that must be paid for in the same extrinsic, and the ignore reason of each unpaid one.
FUNDED_CALLS: dict[type, str] = {BondVerifier: "unfunded_bond", StartTrainingCommitment: "unfunded_run"}


class BondError(ValueError):
    """An amount that cannot be paid (a total past a u128 balance)."""


def bond_address(ss58_format: int | None) -> str:
    """The bond account's SS58 address on a chain with this SS58 prefix (42 when unknown)."""
    return ss58_encode(BOND_ACCOUNT, 42 if ss58_format is None else ss58_format)


def funded_units(call: Any, params: ProtocolParams) -> int | None:
    """The protocol units `call` must carry into the bond account under `params`, or None for a
    call that carries nothing (not a funded call, or a registration whose spec the protocol
    refuses before any money moves: too large, not decodable, no replay cost)."""
    if isinstance(call, BondVerifier):
        return call.amount
    if not isinstance(call, StartTrainingCommitment) or len(call.spec) > MAX_SPEC_BYTES:
        return None
    try:
        blocks = replay_cost(Spec.from_cbor(call.spec), params).blocks
    except (CommitmentError, ValueError, TypeError, ArithmeticError):
        return None
    return params.miner_stake + run_escrow(blocks, params)[1]


def funded_label(call: Any, params: ProtocolParams) -> str:
    """How a funded call is named in a shortfall's detail (what it carries, and why)."""
    if isinstance(call, BondVerifier):
        return f"bond_verifier(amount={call.amount})"
    units = funded_units(call, params) or 0
    return (f"start_training_commitment(run {call.run_id.hex()[:8]}, stake {params.miner_stake} + escrow "
            f"{units - params.miner_stake})")


def bond_planck(amounts: Iterable[int], planck_per_unit: int) -> int:
    """The planck that funded calls of these protocol amounts need, refused past a u128 balance."""
    total = sum(amounts) * planck_per_unit
    if total > MAX_BALANCE:
        raise BondError(f"{sum(amounts)} units x {planck_per_unit} planck exceed a u128 balance")
    return total


def funding_shortfall(
    signer: bytes,
    transfers: Sequence[Transfer],
    amounts: Sequence[int],
    *,
    planck_per_unit: int,
    ss58_format: int | None = None,
    labels: Sequence[str] | None = None,
) -> str | None:
    """None when an extrinsic signed by `signer` whose `transfers` are these pays for funded calls
    carrying `amounts` units; otherwise the detail of their "unfunded_bond" / "unfunded_run"
    records (what was missing). `labels` name the calls (`funded_label`; default: bonds).

    `transfers` are the (from, to, planck) of the extrinsic's Balances.Transfer events.
    """
    need = sum(amounts) * planck_per_unit
    paid = sum(amount for src, dst, amount in transfers if src == signer and dst == BOND_ACCOUNT)
    if paid >= need:
        return None
    bonds = labels is None or all(x.startswith("bond_verifier(") for x in labels)
    if len(amounts) == 1:
        what = f"{labels[0] if labels else f'bond_verifier(amount={amounts[0]})'} needs"
    elif bonds:
        what = f"{len(amounts)} bonds summing to {sum(amounts)} units need"
    else:
        what = f"{len(amounts)} funded calls (bonds, run registrations) summing to {sum(amounts)} units need"
    needs = f"{what} {need} planck ({planck_per_unit} per unit)"
    if paid:
        return f"amount short: {needs}; the signer paid {paid} planck into the bond account"
    elsewhere = [dst for src, dst, _ in transfers if src == signer and dst != BOND_ACCOUNT]
    if elsewhere:
        to = ss58_encode(elsewhere[0], 42 if ss58_format is None else ss58_format)
        return f"wrong destination: {needs}; the signer paid {to}, not the bond account"
    return f"no transfer: {needs} into {bond_address(ss58_format)}; none from the signer in this extrinsic"
