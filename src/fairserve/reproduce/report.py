"""report.md and a self-contained report.html (figures embedded) from the findings. One list of blocks, two
renderers, so the two files always say the same thing. The report opens with a one-screen overview of the paper's
claims (claim, scope, the paper's figure, ours, verdict, figure), then our own findings beyond the paper's scope,
then one section per experiment. `readme_table` renders the same overview for docs/results.md."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .experiments import Experiment, Results

MAX_CLIENT_ROWS = 8


@dataclass
class Finding:
    experiment: Experiment
    holds: bool | None  # None: not run (skipped) or failed to evaluate
    evidence: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    runs: list = field(default_factory=list)  # RunOutputs, in the experiment's order
    ours: str = ""  # the headline number(s) for the overview

    @property
    def verdict(self) -> str:
        if self.experiment.own:  # our own question, not the paper's claim
            return {True: "yes", False: "no", None: "not evaluated"}[self.holds]
        return {True: "holds", False: "does not hold", None: "not evaluated"}[self.holds]


def _overview_rows(findings: list[Finding], links: bool) -> list[list[str]]:
    """One row per finding; with `links`, the name links to its section and the figure to its PNG (the report);
    without, plain names (docs/results.md)."""
    rows = []
    for f in findings:
        e = f.experiment
        claim, scope = e.brief if e.brief[0] else (e.claim, e.scope)
        fig = f.figures[0][0] if f.figures else ""
        rows.append(
            [
                f"[{e.name}](#{e.name})" if links else e.name,
                e.source,
                claim,
                scope,
                e.paper or "—",
                f.ours or "—",
                f"**{f.verdict}**",
                (f"[{fig}]({fig})" if links else f"`{fig}`") if fig else "—",
            ]
        )
    return rows


OVERVIEW_HEAD = ["experiment", "paper", "claim", "scope", "paper's figure", "ours", "verdict", "figure"]


def readme_table(findings: list[Finding]) -> str:
    """The report's overview tables as Markdown for docs/results.md (figure names instead of links)."""
    paper = [f for f in findings if not f.experiment.own]
    own = [f for f in findings if f.experiment.own]
    out: list[tuple[Any, ...]] = [("table", OVERVIEW_HEAD, _overview_rows(paper, links=False))]
    for section, found in _sections(own):
        out += [
            ("p", f"{section} (our own findings, not the paper's claims):"),
            (
                "table",
                ["finding", "relates to", "question", "scope", "—", "ours", "answer", "figure"],
                _overview_rows(found, links=False),
            ),
        ]
    return to_markdown(out)


def _sections(own: list[Finding]) -> list[tuple[str, list[Finding]]]:
    """Our own findings by report section, in order of first appearance."""
    by: dict[str, list[Finding]] = {}
    for f in own:
        by.setdefault(f.experiment.section or "Beyond the paper's scope", []).append(f)
    return list(by.items())


def blocks(findings: list[Finding], meta: dict) -> list[tuple]:
    paper = [f for f in findings if not f.experiment.own]
    own = [f for f in findings if f.experiment.own]
    held = sum(f.holds is True for f in paper)
    out: list[tuple] = [
        ("h1", "fairserve: reproducing *Fairness in Serving Large Language Models*"),
        (
            "p",
            f"Simulated engine: {meta['engine']}. Mode: {meta['mode']}. "
            f"{meta['runs']} simulations in {meta['wall_s']:.1f} s. Service is weighted tokens, "
            "w_p = 1 per prompt token and w_q = 2 per output token, unless stated. Claims, scopes "
            "and page references follow the paper's summary (arXiv 2401.00588v2); each verdict "
            "tests the claim on the scope the paper states.",
        ),
        ("h2", "Overview"),
        ("p", f"{held} of {len(paper)} claims hold."),
        ("table", OVERVIEW_HEAD, _overview_rows(paper, links=True)),
    ]
    for section, found in _sections(own):
        out += [
            ("p", f"**{section}** — our own findings, reported apart from the paper's claims:"),
            (
                "table",
                ["finding", "relates to", "question", "scope", "—", "ours", "answer", "figure"],
                _overview_rows(found, links=True),
            ),
        ]
    for f in paper + own:
        e = f.experiment
        out += [
            ("h2", f"{e.name}: {e.title}"),
            ("p", f"**Source:** {e.source}. **Scope:** {e.scope}."),
            (
                "p",
                f"**Workloads:** {', '.join(e.workloads) or 'none (no simulation)'}. **Policies:** "
                f"{', '.join(dict.fromkeys(r.name for r in e.runs)) or '—'}.",
            ),
            ("p", f"**{'Our question' if e.own else 'The paper' + chr(39) + 's claim'}:** {e.claim}"),
            ("p", f"**The paper's figure:** {e.paper or 'none given'}. **Ours:** {f.ours or '—'}."),
            ("p", f"**{'Answer' if e.own else 'Verdict'}: {f.verdict}.** {f.evidence[:1].upper()}{f.evidence[1:]}."),
        ]
        if f.runs:
            out.append(
                (
                    "table",
                    ["workload", "policy", "output tokens/s", "service/s", "max backlogged diff", "Jain's index"],
                    [_run_row(o) for o in f.runs],
                )
            )
            out.append(
                (
                    "table",
                    ["workload", "policy", "client", "service rate (/s)", "mean response (s)", "p90 response (s)"],
                    [row for o in f.runs for row in _client_rows(o)],
                )
            )
        out += [("img", name, caption) for name, caption in f.figures]
    return out


def _run_row(o) -> list[str]:
    s = o.summary
    jain = f"{s.jain_index:.3f}" if s.jain_index is not None else "n/a"
    return [
        o.spec.workload,
        o.spec.name,
        f"{s.output_tokens_per_s:.1f}",
        f"{s.service_per_s:.1f}",
        f"{s.max_backlogged_diff:,.0f}",
        jain,
    ]


def _client_rows(o) -> list[list[str]]:
    stats = sorted(o.summary.clients.values(), key=lambda c: -c.requests)
    rows = [
        [o.spec.workload, o.spec.name, c.client, f"{c.service_rate:.1f}", _s(c.response_mean_s), _s(c.response_p90_s)]
        for c in stats[:MAX_CLIENT_ROWS]
    ]
    if len(stats) > MAX_CLIENT_ROWS:
        rows.append([o.spec.workload, o.spec.name, f"({len(stats) - MAX_CLIENT_ROWS} more clients)", "", "", ""])
    return rows


def _s(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def to_markdown(bs: list[tuple]) -> str:
    lines = []
    for b in bs:
        if b[0] == "h1":
            lines += [f"# {b[1]}", ""]
        elif b[0] == "h2":
            name = b[1].split(":")[0]
            lines += [f'<a id="{name}"></a>', "", f"## {b[1]}", ""] if ":" in b[1] else [f"## {b[1]}", ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "table":
            lines += ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in b[2]] + [""]
        elif b[0] == "img":
            lines += [f"![{b[2]}]({b[1]})", "", f"*{b[2]}*", ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    """Markdown's **bold**, *italic* and `code` for the HTML twin."""
    import re

    t = html.escape(text)
    t = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r"<a href='\2'>\1</a>", t)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"\*(.+?)\*", r"<i>\1</i>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def to_html(bs: list[tuple], out_dir: Path) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>fairserve reproduction</title><style>"
        "body{font-family:sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;line-height:1.4}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left}img{max-width:100%}figcaption{color:#555;font-size:90%}</style></head><body>"
    ]
    for b in bs:
        if b[0] in ("h1", "h2"):
            anchor = f" id='{html.escape(b[1].split(':')[0])}'" if b[0] == "h2" and ":" in b[1] else ""
            parts.append(f"<{b[0]}{anchor}>{_inline(b[1])}</{b[0]}>")
        elif b[0] == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in b[2])
            parts.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif b[0] == "img":
            data = base64.b64encode((out_dir / b[1]).read_bytes()).decode()
            parts.append(
                f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(b[2])}'>"
                f"<figcaption>{_inline(b[2])}</figcaption></figure>"
            )
    return "\n".join(parts + ["</body></html>"])


def write(findings: list[Finding], out_dir: Path, meta: dict) -> tuple[Path, Path]:
    bs = blocks(findings, meta)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(bs))
    page.write_text(to_html(bs, out_dir))
    return md, page


def judge(exp: Experiment, res: Results) -> tuple[bool | None, str, str]:
    """(holds, evidence, ours) from the experiment's numbers; an evaluation error is reported, not raised."""
    try:
        holds, evidence, ours = exp.judge(res)
        return bool(holds), evidence, ours
    except (KeyError, ZeroDivisionError, TypeError, ValueError) as e:
        return None, f"could not be evaluated ({type(e).__name__}: {e})", ""
