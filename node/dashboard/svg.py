"""Charts as inline SVG, drawn on the server: the committed loss curve with its challenged steps
marked by verdict, and a challenge's timeline as bars. Pure functions from data to markup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

VERDICT_COLORS = {"honest": "#1a7f37", "fraud": "#cf222e", "inconclusive": "#bf8700", "pending": "#6e7781"}
STATE_COLORS = {"done": "#0969da", "running": "#bf8700", "pending": "#d0d7de", "not reached": "#d0d7de"}


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    if not raw > 0 or not math.isfinite(raw):  # a span too small (or too large) for float steps
        return [lo, hi]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out = []
    x = first
    while x <= hi + step * 1e-9 and len(out) < 50:
        out.append(round(x, 12))
        x += step
    return out


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def loss_curve_svg(losses: Sequence[float | None], marks: Sequence[dict[str, Any]], *, width: int = 760,
                   height: int = 300) -> str:
    """The loss of steps 1..T as a line; each mark ({step, verdict, challenge_id}) a dot on the
    curve at its step, coloured by verdict and linking to its challenge page."""
    left, right, top, bottom = 56, 16, 14, 36
    pw, ph = width - left - right, height - top - bottom
    finite = [x for x in losses if x is not None]
    n = max(len(losses), max((m["step"] for m in marks), default=1), 1)
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if not hi - lo > max(abs(hi), abs(lo)) * 1e-9:  # flat: give the line some room around it
        d = max(abs(hi) * 0.05, 0.5)
        lo, hi = lo - d, hi + d
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad

    def sx(step: float) -> float:
        return left + (0.5 if n == 1 else (step - 1) / (n - 1)) * pw

    def sy(v: float) -> float:
        return top + (1 - (v - lo) / (hi - lo)) * ph

    parts = [f'<svg class="loss-curve" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="committed loss per step">',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot-bg"/>']
    for v in nice_ticks(lo, hi):
        y = sy(v)
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for t in nice_ticks(1, n, min(8, n)):
        if float(t).is_integer():
            x = sx(t)
            parts.append(
                f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}"/>'
                f'<text class="tick" x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{int(t)}</text>'
            )
    parts.append(
        f'<text class="axis-label" x="{left + pw / 2}" y="{height - 4}" text-anchor="middle">step</text>'
        f'<text class="axis-label" x="12" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + ph / 2})">loss</text>'
    )
    # A non-finite loss breaks the line: each finite stretch is its own polyline.
    segment: list[str] = []
    segments = []
    for t, x in enumerate(losses, start=1):
        if x is None:
            if segment:
                segments.append(segment)
            segment = []
        else:
            segment.append(f"{sx(t):.1f},{sy(x):.1f}")
    if segment:
        segments.append(segment)
    for seg in segments:
        if len(seg) == 1:
            cx, cy = seg[0].split(",")
            parts.append(f'<circle class="loss-point" cx="{cx}" cy="{cy}" r="2"/>')
        else:
            parts.append(f'<polyline class="loss-line" points="{" ".join(seg)}"/>')
    if not finite:
        parts.append(f'<text class="empty" x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle">'
                     f'no committed losses fetched yet</text>')
    for m in marks:
        step, verdict = int(m["step"]), m.get("verdict") or "pending"
        x = sx(step)
        loss = losses[step - 1] if 1 <= step <= len(losses) else None
        y = sy(loss) if loss is not None else top + ph
        color = VERDICT_COLORS.get(verdict, VERDICT_COLORS["pending"])
        label = f"step {step}: {verdict}" + ("" if loss is None else f", loss {_fmt(loss)}")
        parts.append(
            f'<a href="/challenges/{escape(m["challenge_id"])}" class="mark" data-step="{step}" '
            f'data-verdict="{escape(verdict)}"><title>{escape(label)}</title>'
            f'<line class="mark-line" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="{color}"/>'
            f'<circle class="mark-dot" cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{color}"/>'
            f'<text class="mark-label" x="{x + 8:.1f}" y="{max(top + 12, y - 8):.1f}" fill="{color}">'
            f'{escape(verdict)} @ {step}</text></a>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(entries: Sequence[dict[str, Any]], *, now: float, width: int = 760) -> str:
    """One bar per stage on a shared time axis from the first stage's start; stages never reached
    are listed without a bar."""
    row, left, right, top = 24, 140, 90, 8
    height = top + row * len(entries) + 22
    started = [e["started_at"] for e in entries if e["started_at"] is not None]
    t0 = min(started) if started else now
    ends = [
        e["finished_at"] if e["finished_at"] is not None else now
        for e in entries
        if e["started_at"] is not None
    ]
    span = max(1e-3, (max(ends) if ends else now) - t0)
    pw = width - left - right
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="challenge timeline">']
    for i, e in enumerate(entries):
        y = top + i * row
        parts.append(
            f'<text class="tl-label" x="{left - 8}" y="{y + 15}" '
            f'text-anchor="end">{escape(e["label"])}</text>'
        )
        if e["started_at"] is None:
            parts.append(f'<text class="tl-state" x="{left}" y="{y + 15}">{escape(e["state"])}</text>')
            continue
        end = e["finished_at"] if e["finished_at"] is not None else now
        x = left + (e["started_at"] - t0) / span * pw
        w = max(2.0, (end - e["started_at"]) / span * pw)
        color = STATE_COLORS.get(e["state"], STATE_COLORS["done"])
        parts.append(
            f'<g class="tl-bar" data-stage="{escape(e["stage"])}" data-state="{escape(e["state"])}">'
            f'<title>{escape(e["label"])}: {format_duration(e["duration_s"])}</title>'
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row - 8}" rx="3" fill="{color}"/>'
            f'<text class="tl-dur" x="{min(x + w + 6, width - right + 4):.1f}" y="{y + 15}">'
            f'{format_duration(e["duration_s"])}</text></g>'
        )
    parts.append(f'<text class="tick" x="{left}" y="{height - 4}">0 s</text>'
                 f'<text class="tick" x="{left + pw}" y="{height - 4}" text-anchor="end">'
                 f'{format_duration(span)}</text></svg>')
    return "".join(parts)


def format_duration(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


__all__ = ["VERDICT_COLORS", "format_duration", "loss_curve_svg", "nice_ticks", "timeline_svg"]
