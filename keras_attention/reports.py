"""The demo's report: each recipe's `Result` as text, `report.md` and a
self-contained `report.html` (pictures and attention explorers inlined).

`keras-attention run` prints `format_result`; `keras-attention demo` writes
`write_report` and `write_report_html` into its `--out` folder.
"""

import os

from keras_attention._writing import write_text_atomically


def format_result(result):
    lines = [
        f"{result.task} / {result.model} on {result.data} "
        f"({result.seconds:.0f} s"
        + ("" if result.cpu_seconds is None else f", {result.cpu_seconds:.0f} CPU-s")
        + ")",
        "  metrics: " + ", ".join(f"{k}={v}" for k, v in result.metrics.items()),
    ]
    lines += [f"  {note}" for note in result.notes]
    lines += [f"  wrote {path}" for path in result.files]
    return "\n".join(lines)


_QUICK = (
    "A smoke test (--quick): a few short epochs on a slice of the data, so "
    "these metrics are not what the recipes reach."
)


def mark_in_progress(out):
    """`report.md` in `out` says a demo is running, and an earlier
    `report.html` goes: they would describe the files this run replaces
    (an interrupted run left them looking finished). Returns the path."""
    import time

    page = os.path.join(out, "report.html")
    if os.path.exists(page):
        os.remove(page)
    path = os.path.join(out, "report.md")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    write_text_atomically(
        path,
        "# keras_attention demo: in progress\n\n"
        f"Started {started}. The report is written here when every task "
        "has finished; if this note is still here the run stopped early, "
        "and the task folders may hold files of this run beside those of "
        "an earlier one.\n",
    )
    return path


def write_report(results, out, seconds, cpu_seconds=None, quick=False):
    """`report.md` in `out`: each task's metrics, notes and pictures;
    `quick`: the run was `demo --quick`, which the report says first."""
    path = os.path.join(out, "report.md")
    total = f"{seconds / 60:.1f} minutes in all"
    if cpu_seconds is not None:
        total += f" ({cpu_seconds:.0f} CPU-seconds, load average {os.getloadavg()[0]:.1f})"
    lines = [
        "# keras_attention demo",
        "",
        f"All applications on their embedded data, {total}.",
        "",
    ]
    if quick:
        lines += [f"**{_QUICK}**", ""]
    lines += [
        "| task | model | data | metrics | seconds | CPU-seconds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        metrics = ", ".join(f"{k} {v}" for k, v in r.metrics.items())
        cpu = "" if r.cpu_seconds is None else f"{r.cpu_seconds:.0f}"
        lines.append(
            f"| {r.task} | {r.model} | {r.data} | {metrics} | {r.seconds:.0f} | {cpu} |"
        )
    for r in results:
        lines += ["", f"## {r.task} ({r.model})", ""]
        lines += [f"- {note}" for note in r.notes]
        for file in r.files:
            rel = os.path.relpath(file, out)
            if file.endswith(".png"):
                lines.append(f"![{rel}]({rel})")
            elif file.endswith(".html"):
                lines.append(f"- interactive attention: [{rel}]({rel})")
            else:
                lines.append(f"- model: `{rel}`")
    write_text_atomically(path, "\n".join(lines) + "\n")
    return path


def write_report_html(results, out, seconds, cpu_seconds=None, quick=False):
    """`report.html` in `out`: one self-contained page with each task's
    metrics, its pictures and its attention explorer (inlined, no network);
    `quick` as in `write_report`."""
    import base64
    import html

    def escape(text):
        return html.escape(str(text))

    total = f"{seconds / 60:.1f} minutes in all"
    if cpu_seconds is not None:
        total += f" ({cpu_seconds:.0f} CPU-seconds)"
    rows = "".join(
        f"<tr><td><a href='#{escape(r.task)}'>{escape(r.task)}</a></td>"
        f"<td>{escape(r.model)}</td><td>{escape(r.data)}</td><td>"
        + ", ".join(f"{escape(k)} <b>{escape(v)}</b>" for k, v in r.metrics.items())
        + f"</td><td>{r.seconds:.0f}</td></tr>"
        for r in results
    )
    sections = []
    for r in results:
        parts = [f"<section id='{escape(r.task)}'><h2>{escape(r.task)} "
                 f"({escape(r.model)})</h2><p class='metrics'>"
                 + ", ".join(f"{escape(k)} <b>{escape(v)}</b>" for k, v in r.metrics.items())
                 + f" &middot; {escape(r.data)}</p>"]
        parts += [f"<p class='note'>{escape(note)}</p>" for note in r.notes]
        pictures = [f for f in r.files if f.endswith(".png")]
        if pictures:
            parts.append("<div class='pictures'>")
            for file in pictures:
                with open(file, "rb") as f:
                    data = base64.b64encode(f.read()).decode("ascii")
                parts.append(
                    f"<img alt='{escape(os.path.basename(file))}' "
                    f"src='data:image/png;base64,{data}'>"
                )
            parts.append("</div>")
        for file in (f for f in r.files if f.endswith("_explorer.html")):
            with open(file, encoding="utf-8") as f:
                page = f.read()
            parts.append(
                "<h3>Explore the attention</h3><iframe class='explorer' "
                f"title='attention explorer: {escape(r.task)}' "
                f"srcdoc=\"{html.escape(page, quote=True)}\"></iframe>"
            )
        parts.append("</section>")
        sections.append("".join(parts))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>keras_attention demo</title>
<style>
body {{ margin: 0; padding: 16px 24px; font: 14px/1.45 system-ui, sans-serif; color: #1d2330; background: #f6f7f9; }}
table {{ border-collapse: collapse; background: #fff; }}
td, th {{ border: 1px solid #d7dce4; padding: 4px 8px; text-align: left; }}
section {{ margin-top: 28px; }}
.pictures img {{ max-height: 260px; margin: 4px; border: 1px solid #d7dce4; background: #fff; }}
.note {{ color: #667085; margin: 2px 0; }}
iframe.explorer {{ width: 100%; height: 900px; border: 1px solid #d7dce4; border-radius: 8px; background: #fff; }}
</style></head><body>
<h1>keras_attention demo</h1>
<p>All applications on their embedded data, {escape(total)}. Each task's
pictures are followed by its attention explorer (hover and choose layers and
heads); the same explorers are in the task folders as <code>*_explorer.html</code>.</p>
{f"<p><b>{escape(_QUICK)}</b></p>" if quick else ""}
<table><tr><th>task</th><th>model</th><th>data</th><th>metrics</th><th>seconds</th></tr>{rows}</table>
{"".join(sections)}
<script>
for (const frame of document.querySelectorAll("iframe.explorer")) {{
  frame.addEventListener("load", () => {{
    const body = frame.contentDocument && frame.contentDocument.body;
    if (body) frame.style.height = Math.min(body.scrollHeight + 40, 2400) + "px";
  }});
}}
</script>
</body></html>
"""
    path = os.path.join(out, "report.html")
    write_text_atomically(path, page)
    return path
