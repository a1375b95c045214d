"""The one `pot` command. Each package owns its noun's sub-app; this file only mounts them.

Sub-apps import heavy modules (torch, substrate-interface) inside their commands, so
`pot --help` stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="pot",
    help="Proof-of-Training verifier node: commitments, exact-v1 oracle, protocol and chain.",
    no_args_is_help=True,
    add_completion=False,
    # Plain text help: as rich markup, every bracketed name ("[init]", "[protocol]") would vanish.
    # The sub-apps set the same, so each renders the same run on its own.
    rich_markup_mode=None,
)

# noun -> (module, attribute, help)
SUBAPPS = [
    ("data", "commitments.cli", "data_app", "Datasets: prepare the default corpus, hash, prove samples."),
    ("transcript", "commitments.cli", "transcript_app", "Signed run transcripts: verify offline."),
    ("spec", "commitments.cli", "spec_app", "Execution specs: validate, show the canonical form, print the digest."),
    ("oracle", "oracle.cli", "app", "The exact-v1 oracle: walk a run, replay one step."),
    ("chain", "chain.cli", "app", "Chains: run a dev chain, print protocol events."),
    ("miner", "miner.cli", "miner_app", "Miners: train with commitments, serve openings."),
    ("recipe", "miner.cli", "recipe_app", "Run documents: write and verify promised digests."),
    ("model", "miner.cli", "model_app", "Pretrained checkpoints: import Hugging Face GPT-2 and Llama for fine-tuning."),
    ("node", "node.commands", "node_app", "The verifier node: init its database, run the daemon."),
    ("verify", "node.commands", "verify_app", "Offline checks: verify one opening."),
    ("demo", "devnet.cli", "demo_app",
     "The whole protocol on one machine: a miner, four verifiers (two honest, one revealing noise, one lazy), "
     "a dashboard."),
    ("redteam", "devnet.cli", "redteam_app", "Forge a fresh run every way the protocol must stop; check each is caught."),
    ("devnet", "devnet.cli", "devnet_app", "Test networks only: a verifier node with an injected fault."),
]

for noun, module, attr, help_text in SUBAPPS:
    app.add_typer(getattr(importlib.import_module(module), attr), name=noun, help=help_text)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
