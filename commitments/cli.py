"""`pot data`, `pot transcript` and `pot spec`: the commitments layer on the command line.

Modules are imported inside the commands so `pot --help` stays fast. Exit codes: 0 success,
1 a check that ran and failed (a transcript that does not verify), 2 bad input (refused with a
reason on stderr).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import typer

data_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
transcript_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
spec_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)

EXIT_FAILED = 1
EXIT_REFUSED = 2
DEFAULT_SAMPLE_LEN = 65


@data_app.callback()
def _data() -> None:
    """Datasets: prepare the default corpus, hash a corpus, prove a sample."""


@transcript_app.callback()
def _transcript() -> None:
    """Signed run transcripts."""


@spec_app.callback()
def _spec() -> None:
    """Execution specs: validate, show the canonical form, print the digest."""


def _refuse(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_REFUSED)


def _emit(obj: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    if as_json:
        typer.echo(json.dumps(obj, indent=2, sort_keys=True))
    else:
        for line in lines:
            typer.echo(line)


def _sample_len(sample_len: int | None, spec: Path | None) -> int:
    from commitments.errors import CommitmentError
    from commitments.spec import Spec

    if spec is not None:
        if sample_len is not None:
            _refuse("give --sample-len or --spec, not both")
        try:
            return Spec.from_toml(spec).sample_len
        except CommitmentError as exc:
            _refuse(str(exc))
    if sample_len is None:
        return DEFAULT_SAMPLE_LEN
    if sample_len <= 0:
        _refuse(f"--sample-len must be positive, got {sample_len}")
    return sample_len


def _open(file: Path, sample_len: int, vocab_size: int | None):
    from commitments.dataset import Dataset, DatasetError

    try:
        return Dataset.open(file, sample_len, vocab_size=vocab_size)
    except DatasetError as exc:
        _refuse(str(exc))


# --- pot data ---------------------------------------------------------------------------------

SampleLenOpt = typer.Option(None, "--sample-len", help=f"tokens per sample (default {DEFAULT_SAMPLE_LEN})")
SpecOpt = typer.Option(None, "--spec", help="take the sample length (seq_len + 1) from this spec")
JsonOpt = typer.Option(False, "--json", help="print one JSON object")


@data_app.command("prepare")
def data_prepare(
    out: Path = typer.Option(
        ..., "--out", help="corpus file to write (.npy; a .json sidecar goes next to it)"
    ),
    sample_len: int | None = SampleLenOpt,
    spec: Path | None = SpecOpt,
    max_bytes: int = typer.Option(4 * 1024 * 1024, "--max-bytes", help="size cap of the corpus in bytes"),
    as_json: bool = JsonOpt,
) -> None:
    """Build the default corpus: the standard library's top-level .py sources, byte-level tokens."""
    from commitments.dataset import (
        DEFAULT_VOCAB_SIZE,
        DatasetError,
        prepare_default_corpus,
        train_validation_split,
    )

    n = _sample_len(sample_len, spec)
    try:
        info = prepare_default_corpus(out, max_bytes=max_bytes)
    except DatasetError as exc:
        _refuse(str(exc))
    except OSError as exc:
        _refuse(f"{out}: cannot write corpus: {exc.strerror or exc}")
    ds = _open(Path(info.path), n, DEFAULT_VOCAB_SIZE)
    if ds.num_samples >= 2:
        train, val = train_validation_split(ds.num_samples)
        n_train, n_val = len(train), len(val)
    else:
        n_train, n_val = ds.num_samples, 0
    obj = {
        "path": info.path,
        "sidecar": info.sidecar,
        "num_tokens": info.num_tokens,
        "num_files": info.num_files,
        "python_version": info.python_version,
        "file_list_digest": info.file_list_digest.hex(),
        "sample_len": n,
        "num_samples": ds.num_samples,
        "train_samples": n_train,
        "validation_samples": n_val,
        "dataset_hash": ds.dataset_hash.hex(),
    }
    _emit(
        obj,
        as_json,
        [
            f"wrote {info.path} ({info.num_tokens} tokens from {info.num_files} files, Python "
            f"{info.python_version})",
            f"sidecar {info.sidecar}",
            f"samples {ds.num_samples} of {n} tokens: {n_train} train, {n_val} validation (the last ones)",
            f"dataset hash {obj['dataset_hash']}",
        ],
    )


@data_app.command("hash")
def data_hash(
    file: Path = typer.Argument(..., help="token corpus (.npy, uint16 or uint32)"),
    sample_len: int | None = SampleLenOpt,
    spec: Path | None = SpecOpt,
    vocab_size: int | None = typer.Option(None, "--vocab-size", help="refuse tokens >= this"),
    as_json: bool = JsonOpt,
) -> None:
    """Print a corpus's sample count and dataset hash (Merkle root over sample digests)."""
    ds = _open(file, _sample_len(sample_len, spec), vocab_size)
    info = ds.info()
    _emit(info.as_json(), as_json, [
        f"{info.path}: {info.num_tokens} tokens ({info.dtype})",
        f"samples {info.num_samples} of {info.sample_len} tokens",
        f"dataset hash {info.dataset_hash.hex()}",
    ])


@data_app.command("prove")
def data_prove(
    file: Path = typer.Argument(..., help="token corpus (.npy, uint16 or uint32)"),
    index: int = typer.Option(..., "--index", help="sample index"),
    sample_len: int | None = SampleLenOpt,
    spec: Path | None = SpecOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Print one sample, its digest and its inclusion proof under the dataset hash."""
    from commitments.dataset import DatasetError

    ds = _open(file, _sample_len(sample_len, spec), None)
    try:
        tokens = ds.sample(index)
        proof = ds.sample_proof(index)
    except DatasetError as exc:
        _refuse(str(exc))
    obj = {
        "index": index,
        "num_samples": ds.num_samples,
        "sample_len": ds.sample_len,
        "dtype": ds.tokens.dtype.name,
        "tokens": [int(x) for x in tokens],
        "sample_digest": ds.sample_digest(index).hex(),
        "proof": [p.hex() for p in proof],
        "dataset_hash": ds.dataset_hash.hex(),
    }
    _emit(obj, as_json, [
        f"sample {index} of {ds.num_samples}: digest {obj['sample_digest']}",
        f"dataset hash {obj['dataset_hash']}",
        "proof " + (" ".join(obj["proof"]) or "(empty: single-sample dataset)"),
    ])


# --- pot transcript ---------------------------------------------------------------------------


@transcript_app.command("verify")
def transcript_verify(
    file: Path = typer.Argument(..., help="transcript file"),
    as_json: bool = JsonOpt,
) -> None:
    """Check a transcript offline; exit 0 only if every record verifies."""
    from commitments.transcript import TranscriptError, verify_transcript

    try:
        report = verify_transcript(file)
    except TranscriptError as exc:
        _refuse(str(exc))
    lines = []
    if report.records:
        lines.append(f"run {report.run_name!r}, session key {report.session_key.hex()}, "
                     f"{report.records} records verified, head {report.head.hex()}")
    if report.ok:
        lines.append("ok")
    else:
        lines.append(f"FAILED at {report.problem}")
    _emit(report.as_json(), as_json, lines)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


# --- pot spec ---------------------------------------------------------------------------------


def _load_spec(path: Path):
    from commitments.spec import Spec, SpecError

    try:
        return Spec.from_toml(path)
    except SpecError as exc:
        _refuse(str(exc))


def _load_spec_and_defaults(path: Path):
    """(the spec, the fields of its canonical form the file left to their defaults)."""
    from commitments.spec import Spec, SpecError, filled_defaults, read_toml

    try:
        data = read_toml(path)
        spec = Spec.from_dict(data, source=str(path))
    except SpecError as exc:
        _refuse(str(exc))
    return spec, filled_defaults(spec, data)


@spec_app.command("validate")
def spec_validate(
    spec: Path = typer.Argument(..., help="spec TOML file"),
    as_json: bool = JsonOpt,
) -> None:
    """Validate a spec and print its digest and the defaults it took for the fields the file does
    not give; a refused spec exits 2 with the reason."""
    from commitments.spec import toml_value

    s, defaults = _load_spec_and_defaults(spec)
    d = s.digest().hex()
    lines = [f"valid spec, digest {d}"]
    if defaults:
        lines.append(f"defaults filled in ({len(defaults)}; `pot spec show --canonical` prints every field):")
        lines += [f"  {k} = {'null' if v is None else toml_value(v)}" for k, v in defaults.items()]
    _emit({"path": str(spec), "valid": True, "digest": d, "profile": s.profile, "steps": s.steps,
           "sample_len": s.sample_len, "spec": s.canonical(), "defaults": defaults}, as_json, lines)


@spec_app.command("show")
def spec_show(
    spec: Path = typer.Argument(..., help="spec TOML file"),
    canonical: bool = typer.Option(
        False,
        "--canonical",
        help="print the canonical form as a spec file (TOML): "
        "every field the digest covers, defaults included",
    ),
) -> None:
    """Print the canonical spec as JSON, with its digest: every field the digest covers, defaults
    included. A gpt or mlp model holds every model field but the Llama ones (hidden too, which a
    GPT never reads), a llama model every one but hidden, bias and gelu, and the optimizer holds the
    fields of both AdamW and SGD whichever it names. Later additions still at their default (the
    schedule, micro_batches) are left out, as the digest leaves them out (docs/protocol.md §3.4.1).
    With --canonical, the same form as TOML that loads back to the same digest, the fields left out
    at their default as comment lines."""
    s = _load_spec(spec)
    if canonical:
        typer.echo(s.canonical_toml(str(spec)), nl=False)
        return
    obj = {"digest": s.digest().hex(), "spec": s.canonical()}
    typer.echo(json.dumps(obj, indent=2, sort_keys=True))


@spec_app.command("digest")
def spec_digest(
    spec: Path = typer.Argument(..., help="spec TOML file"),
    as_json: bool = JsonOpt,
) -> None:
    """Print the spec digest a run's registration puts on chain: digest("pot/spec/v1", the canonical
    spec map), in hex."""
    s = _load_spec(spec)
    d = s.digest().hex()
    _emit({"path": str(spec), "digest": d, "cbor_bytes": len(s.to_cbor())}, as_json, [d])
