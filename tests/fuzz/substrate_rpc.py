"""A stand-in for the one RPC choke point of the Substrate transports (SubstrateClient) that
answers from a block the test builds; everything behind it (block reading, remark decoding, the
protocol) is the real code. Shared by the Hypothesis remark tests and the atheris block target."""

from __future__ import annotations

from typing import Any

from substrateinterface import Keypair

from chain.substrate.remark import RemarkTransport


class BlockClient:
    """Answers the RPC calls of one block read from `self.block` (extrinsics, events)."""

    ss58_format = 42

    def __init__(self) -> None:
        self.block: tuple[list[Any], list[Any]] = ([], [])

    def ensure_connected(self) -> None:
        pass

    def close(self) -> None:
        pass

    def rpc(self, method: str, params: list[Any], *, retry: bool = True) -> Any:
        return {"chain_getFinalizedHead": "0x" + "11" * 32, "chain_getHeader": {"number": "0x10"},
                "chain_getBlockHash": "0x" + "22" * 32}[method]

    def call(self, what: str, fn: Any, *, retry: bool = True) -> Any:
        return self.block


def remark_transport() -> tuple[RemarkTransport, BlockClient]:
    client = BlockClient()
    return RemarkTransport(client, Keypair.create_from_uri("//Alice")), client
