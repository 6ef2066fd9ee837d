"""A timeline picture (SVG, no dependencies): one row per job, coloured segments by status over time,
preemption markers labelled with their kind, and the demo's steps as vertical lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import escape

COLOURS = {
    "SUBMITTED": "#cfd8dc",
    "RUNNABLE": "#f6c85f",
    "SCHEDULED": "#9fd3e8",
    "STARTING": "#6fb7d6",
    "RUNNING": "#58a55c",
    "SUCCEEDED": "#4a7fc1",
    "FAILED": "#d9534f",
}
KIND_COLOURS = {"CROSS_SHARE": "#c0392b", "IN_SHARE": "#8e44ad", "TRAINING_PLAN": "#d68910"}
KIND_LABELS = {"CROSS_SHARE": "cross-share", "IN_SHARE": "in-share", "TRAINING_PLAN": "training-plan"}

LEFT = 190
RIGHT = 30
TOP = 92
ROW = 46
BAR = 22


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    status: str


@dataclass(frozen=True)
class Marker:
    at: int
    kind: str  # CROSS_SHARE | IN_SHARE
    label: str
    stopped_at: int | None = None
    """When the victim's node reported it stopped (the end of the stop in progress)."""


@dataclass
class Track:
    name: str
    detail: str
    segments: list[Segment] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


@dataclass
class Timeline:
    title: str
    subtitle: str
    start: int
    end: int
    tracks: list[Track] = field(default_factory=list)
    steps: list[tuple[int, str]] = field(default_factory=list)


def segments_from_samples(samples: list[tuple[int, str]], end: int) -> list[Segment]:
    """Collapse (time ms, status) samples into segments; each lasts until the next change (or ``end``)."""
    out: list[Segment] = []
    for i, (at, status) in enumerate(samples):
        until = samples[i + 1][0] if i + 1 < len(samples) else end
        if until < at:
            continue
        if out and out[-1].status == status:
            out[-1] = Segment(out[-1].start, until, status)
        else:
            out.append(Segment(at, until, status))
    return [s for s in out if s.end > s.start]


def _triangle(x: float, y: float, colour: str) -> str:
    """A downward triangle 10 px wide whose top edge is centred on (x, y)."""
    return f'<path d="M{x - 5:.1f},{y:.1f} L{x + 5:.1f},{y:.1f} L{x:.1f},{y + 8:.1f} Z" fill="{colour}"/>'


def _ticks(span_s: float) -> float:
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600):
        if span_s / step <= 12:
            return step
    return 1200.0


def render_svg(timeline: Timeline, width: int = 1000) -> str:
    span = max(1, timeline.end - timeline.start)
    plot = width - LEFT - RIGHT
    height = TOP + ROW * len(timeline.tracks) + 96

    def x(at: int) -> float:
        return LEFT + plot * (min(max(at, timeline.start), timeline.end) - timeline.start) / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        "<defs>"
        '<pattern id="stopping" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#58a55c"/>'
        '<rect width="3" height="6" fill="#2e6b31"/></pattern>'
        "</defs>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="16" y="24" font-size="16" font-weight="bold">{escape(timeline.title)}</text>',
        f'<text x="16" y="44" fill="#555">{escape(timeline.subtitle)}</text>',
    ]
    # time grid
    span_s = span / 1000
    tick = _ticks(span_s)
    bottom = TOP + ROW * len(timeline.tracks)
    for k in range(int(span_s / tick + 1e-9) + 1):
        t = round(k * tick, 3)
        tx = LEFT + plot * t / span_s
        parts.append(f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{bottom}" stroke="#eeeeee"/>')
        parts.append(f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle" fill="#777">{t:g} s</text>')
    # rows
    for i, track in enumerate(timeline.tracks):
        y = TOP + ROW * i
        mid = y + ROW / 2
        parts.append(
            f'<text x="16" y="{mid - 2:.1f}" font-weight="bold">{escape(track.name)}</text>'
            f'<text x="16" y="{mid + 12:.1f}" fill="#666" font-size="11">{escape(track.detail)}</text>'
        )
        top = mid - BAR / 2
        stopping = [(m.at, m.stopped_at) for m in track.markers if m.stopped_at and m.stopped_at > m.at]
        labels = []
        for seg in track.segments:
            x0, x1 = x(seg.start), x(seg.end)
            colour = COLOURS.get(seg.status, "#bbbbbb")
            parts.append(
                f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(0.5, x1 - x0):.1f}" height="{BAR}" '
                f'fill="{colour}"><title>{escape(seg.status)}: {(seg.start - timeline.start) / 1000:.2f}'
                f" s to {(seg.end - timeline.start) / 1000:.2f} s</title></rect>"
            )
            shown_end = min([seg.end, *(a for a, _ in stopping if seg.start < a < seg.end)])
            x1 = x(shown_end)
            if x1 - x0 > 56:
                ink = "#ffffff" if seg.status in ("RUNNING", "SUCCEEDED", "FAILED") else "#333"
                labels.append(
                    f'<text x="{(x0 + x1) / 2:.1f}" y="{mid + 4:.1f}" text-anchor="middle" '
                    f'fill="{ink}" font-size="10">{escape(seg.status)}</text>'
                )
        for start, stop in stopping:
            sx0, sx1 = x(start), x(stop or start)
            parts.append(
                f'<rect x="{sx0:.1f}" y="{top:.1f}" width="{max(0.5, sx1 - sx0):.1f}" height="{BAR}" '
                f'fill="url(#stopping)"><title>stopping: preempted, waiting for the node to report the '
                f"attempt stopped</title></rect>"
            )
        parts.extend(labels)
        for marker in track.markers:
            mx = x(marker.at)
            colour = KIND_COLOURS.get(marker.kind, "#333333")
            parts.append(
                f'<line x1="{mx:.1f}" y1="{top - 8:.1f}" x2="{mx:.1f}" y2="{top + BAR + 2:.1f}" '
                f'stroke="{colour}" stroke-width="2"/>'
                + _triangle(mx, top - 12, colour)
                + f'<text x="{mx + 7:.1f}" y="{top - 4:.1f}" fill="{colour}" font-size="11" '
                f'font-weight="bold">{escape(KIND_LABELS.get(marker.kind, marker.kind))} preemption '
                f"{escape(marker.label)}</text>"
            )
    # steps: dashed lines; labels in lanes above the rows so that they never overlap
    lanes: list[float] = []
    for at, label in timeline.steps:
        sx = x(at)
        width_px = 6.2 * len(label) + 8
        lane = next((i for i, free in enumerate(lanes) if sx >= free), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
        lanes[lane] = sx + width_px
        ly = TOP - 10 - 14 * lane
        parts.append(
            f'<line x1="{sx:.1f}" y1="{ly - 10:.1f}" x2="{sx:.1f}" y2="{bottom}" stroke="#333" '
            f'stroke-dasharray="4,3" stroke-width="1"/>'
            f'<text x="{sx + 3:.1f}" y="{ly:.1f}" fill="#333" font-size="11">{escape(label)}</text>'
        )
    # legend
    ly = bottom + 40
    lx = 16.0
    for status in ("RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"):
        parts.append(
            f'<rect x="{lx:.1f}" y="{ly - 10}" width="14" height="12" fill="{COLOURS[status]}"/>'
            f'<text x="{lx + 19:.1f}" y="{ly}">{status}</text>'
        )
        lx += 30 + 7.5 * len(status)
    parts.append(
        f'<rect x="{lx:.1f}" y="{ly - 10}" width="14" height="12" fill="url(#stopping)"/>'
        f'<text x="{lx + 19:.1f}" y="{ly}">stopping after preemption</text>'
    )
    ly += 22
    lx = 16.0
    for kind, label in KIND_LABELS.items():
        colour = KIND_COLOURS[kind]
        parts.append(
            _triangle(lx + 5, ly - 10, colour) + f'<text x="{lx + 16:.1f}" y="{ly}">{label} preemption</text>'
        )
        lx += 170
    parts.append(
        f'<line x1="{lx:.1f}" y1="{ly - 11}" x2="{lx:.1f}" y2="{ly + 1}" stroke="#333" '
        'stroke-dasharray="4,3"/>'
        f'<text x="{lx + 8:.1f}" y="{ly}">demo step</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
