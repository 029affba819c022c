"""report.md and a self-contained report.html (figures embedded) from the findings. One list of blocks, two
renderers, so the two files always say the same thing."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from .experiments import Experiment, Results

MAX_CLIENT_ROWS = 8


@dataclass
class Finding:
    experiment: Experiment
    holds: bool | None                  # None: not run (skipped) or failed to evaluate
    evidence: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    runs: list = field(default_factory=list)    # RunOutputs, in the experiment's order

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "not evaluated"}[self.holds]


def blocks(findings: list[Finding], meta: dict) -> list[tuple]:
    out: list[tuple] = [("h1", "fairserve: reproducing *Fairness in Serving Large Language Models*"),
                        ("p", f"Simulated engine: {meta['engine']}. Mode: {meta['mode']}. "
                              f"{meta['runs']} simulations in {meta['wall_s']:.1f} s. Service is weighted tokens, "
                              "w_p = 1 per prompt token and w_q = 2 per output token, unless stated."),
                        ("table", ["experiment", "claim", "verdict"],
                         [[f.experiment.name, f.experiment.claim, f"**{f.verdict}**"] for f in findings])]
    for f in findings:
        e = f.experiment
        out += [("h2", f"{e.name}: {e.title}"),
                ("p", f"**Workloads:** {', '.join(e.workloads)}. **Policies:** "
                      f"{', '.join(dict.fromkeys(r.name for r in e.runs))}."),
                ("p", f"**The paper's claim:** {e.claim}"),
                ("p", f"**Verdict: {f.verdict}.** {f.evidence[:1].upper()}{f.evidence[1:]}.")]
        if f.runs:
            out.append(("table", ["workload", "policy", "output tokens/s", "service/s", "max backlogged diff",
                                  "Jain's index"], [_run_row(o) for o in f.runs]))
            out.append(("table", ["workload", "policy", "client", "service rate (/s)", "mean response (s)",
                                  "p90 response (s)"], [row for o in f.runs for row in _client_rows(o)]))
        out += [("img", name, caption) for name, caption in f.figures]
    return out


def _run_row(o) -> list[str]:
    s = o.summary
    jain = f"{s.jain_index:.3f}" if s.jain_index is not None else "n/a"
    return [o.spec.workload, o.spec.name, f"{s.output_tokens_per_s:.1f}", f"{s.service_per_s:.1f}",
            f"{s.max_backlogged_diff:,.0f}", jain]


def _client_rows(o) -> list[list[str]]:
    stats = sorted(o.summary.clients.values(), key=lambda c: -c.requests)
    rows = [[o.spec.workload, o.spec.name, c.client, f"{c.service_rate:.1f}", _s(c.response_mean_s),
             _s(c.response_p90_s)] for c in stats[:MAX_CLIENT_ROWS]]
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
            lines += [f"## {b[1]}", ""]
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
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"\*(.+?)\*", r"<i>\1</i>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def to_html(bs: list[tuple], out_dir: Path) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>fairserve reproduction</title><style>"
             "body{font-family:sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;line-height:1.4}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left}img{max-width:100%}figcaption{color:#555;font-size:90%}</style></head><body>"]
    for b in bs:
        if b[0] in ("h1", "h2"):
            parts.append(f"<{b[0]}>{_inline(b[1])}</{b[0]}>")
        elif b[0] == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in b[2])
            parts.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif b[0] == "img":
            data = base64.b64encode((out_dir / b[1]).read_bytes()).decode()
            parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(b[2])}'>"
                         f"<figcaption>{_inline(b[2])}</figcaption></figure>")
    return "\n".join(parts + ["</body></html>"])


def write(findings: list[Finding], out_dir: Path, meta: dict) -> tuple[Path, Path]:
    bs = blocks(findings, meta)
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(bs))
    page.write_text(to_html(bs, out_dir))
    return md, page


def judge(exp: Experiment, res: Results) -> tuple[bool | None, str]:
    """The experiment's verdict from its numbers; an evaluation error is reported, not raised."""
    try:
        holds, evidence = exp.judge(res)
        return bool(holds), evidence
    except (KeyError, ZeroDivisionError, TypeError, ValueError) as e:
        return None, f"could not be evaluated ({type(e).__name__}: {e})"
