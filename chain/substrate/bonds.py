"""Verifier bonds on Substrate chains: the protocol's keyless bond account and the funding rule.

On the dev chain a bond is accounting only. On a Substrate chain a `bond_verifier(amount)` call
must be paid for in the chain's own currency, in a way every node can check from the block alone:

The rule. A `bond_verifier` remark counts only if the same extrinsic carries successful balance
transfers from the extrinsic's signer into the bond account (`BOND_ACCOUNT`) totalling at least
`amount x planck_per_unit` planck, as shown by that extrinsic's `Balances.Transfer` events
(`from`, `to`, `amount`). Several bond remarks in one extrinsic need transfers that cover their
sum; when they do not, none of them counts (all or nothing, so no ordering question arises).
Transfers count for their own extrinsic only, never for another one. Transfers from any other
account, or to any other account, fund nothing. A remark that fails the rule becomes an
`Ignored` record with reason "unfunded_bond" and a detail naming what was missing (no transfer,
a wrong destination, or the amount short, with the numbers); the protocol never sees the call.

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

Units. `planck_per_unit` converts protocol units (the `amount` of a bond) into the chain's
smallest currency unit; the default `PLANCK_PER_UNIT` is 10**10. It is set per transport
(`RemarkTransport(..., planck_per_unit=...)`, or the `planck_per_unit` option of
`connect_substrate` / `chain.connect`) and is part of the network's rules: every node of one
network must use the same value, or they disagree about which bonds count.

Unbonding. A remark-only chain cannot give value back from a keyless account: nothing is ever
transferred back, and `unbond_verifier` is carried as a plain remark (the protocol's own
accounting releases the bond; the planck stay in the bond account).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scalecodec.utils.ss58 import ss58_encode

PALLET_TYPE_ID = b"modl"
BOND_PALLET_ID = b"pot/bond"
BOND_ACCOUNT: bytes = (PALLET_TYPE_ID + BOND_PALLET_ID).ljust(32, b"\x00")
PLANCK_PER_UNIT = 10**10
MAX_BALANCE = 2**128 - 1  # Substrate balances are u128

# The balance calls `submit` may compose, in order of preference; the first the runtime has wins.
TRANSFER_CALLS = ("transfer_keep_alive", "transfer_allow_death", "transfer")

Transfer = tuple[bytes, bytes, int]  # (from account id, to account id, planck)


class BondError(ValueError):
    """A bond setting or amount that cannot be used (planck_per_unit, an overflowing total)."""


def bond_address(ss58_format: int | None) -> str:
    """The bond account's SS58 address on a chain with this SS58 prefix (42 when unknown)."""
    return ss58_encode(BOND_ACCOUNT, 42 if ss58_format is None else ss58_format)


def check_planck_per_unit(value: object) -> int:
    """`value` as a planck-per-unit setting: an int from 1 to 2**64, or BondError saying why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BondError(f"planck_per_unit must be an integer, got {type(value).__name__}")
    if not 1 <= value <= 2**64:
        raise BondError(f"planck_per_unit must be in 1..2**64, got {value}")
    return value


def bond_planck(amounts: Iterable[int], planck_per_unit: int) -> int:
    """The planck that bonds of these protocol amounts need, refused past a u128 balance."""
    total = sum(amounts) * planck_per_unit
    if total > MAX_BALANCE:
        raise BondError(f"bonds of {sum(amounts)} units x {planck_per_unit} planck exceed a u128 balance")
    return total


def funding_shortfall(
    signer: bytes,
    transfers: Sequence[Transfer],
    amounts: Sequence[int],
    *,
    planck_per_unit: int,
    ss58_format: int | None = None,
) -> str | None:
    """None when an extrinsic signed by `signer` whose `transfers` are these pays for bond calls
    of `amounts`; otherwise the detail of their "unfunded_bond" records (what was missing).

    `transfers` are the (from, to, planck) of the extrinsic's Balances.Transfer events.
    """
    need = sum(amounts) * planck_per_unit
    paid = sum(amount for src, dst, amount in transfers if src == signer and dst == BOND_ACCOUNT)
    if paid >= need:
        return None
    what = (
        f"bond_verifier(amount={amounts[0]}) needs" if len(amounts) == 1
        else f"{len(amounts)} bonds summing to {sum(amounts)} units need"
    )
    needs = f"{what} {need} planck ({planck_per_unit} per unit)"
    if paid:
        return f"amount short: {needs}; the signer paid {paid} planck into the bond account"
    elsewhere = [dst for src, dst, _ in transfers if src == signer and dst != BOND_ACCOUNT]
    if elsewhere:
        to = ss58_encode(elsewhere[0], 42 if ss58_format is None else ss58_format)
        return f"wrong destination: {needs}; the signer paid {to}, not the bond account"
    return f"no transfer: {needs} into {bond_address(ss58_format)}; none from the signer in this extrinsic"
