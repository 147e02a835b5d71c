"""Render the course as static HTML: every notebook with its stored outputs (nothing is executed), plus an index.

    python tools/build_site.py            # writes site/ (what `make site` runs)
    python tools/build_site.py --out DIR notebooks/00_welcome.ipynb

Each page is made by nbconvert's HTML exporter (the JupyterLab look) with the images of its markdown cells embedded,
so a page is one file that works offline, and with the saved widget state (the live widget needs its JavaScript from
the network; beside every widget the notebook shows a static figure). Links between notebooks point to their pages,
`figures/` is copied beside them, and each page gets a bar with the previous and next notebook. Math is typeset by
MathJax: a local copy when one is installed (Debian's libjs-mathjax, or the folder named by MINIRL_MATHJAX), copied
into the site so that it works offline, else MathJax from its CDN. The index lists the notebooks in course order
with the one-line descriptions of the README's course map.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
MATHJAX_DIRS = [os.environ.get("MINIRL_MATHJAX", ""), "/usr/share/javascript/mathjax", "/usr/share/mathjax"]
# the parts of MathJax 2 that the exporter's configuration (TeX input, CommonHTML output) loads
MATHJAX_PARTS = ["MathJax.js", "config/TeX-AMS_CHTML-full.js", "config/Safe.js", "extensions", "jax/input/TeX",
                 "jax/output/CommonHTML", "jax/element", "localization/en", "fonts/HTML-CSS/TeX/woff"]
LINK = re.compile(r'href="(?:\./)?(\d\d_[A-Za-z0-9_]+)\.ipynb(#[^"]*)?"')
STYLE = """<style>
.minirl-nav { font: 14px/1.4 system-ui, sans-serif; padding: 8px 16px; background: #f3f6fa;
  border-bottom: 1px solid #d0d7de; display: flex; justify-content: space-between;
  position: sticky; top: 0; z-index: 10; }
.minirl-nav a { color: #0b57a4; text-decoration: none; } .minirl-nav a:hover { text-decoration: underline; }
.jp-RenderedMarkdown img { max-width: 100%; }
</style>"""


def course_map(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """``{notebook stem: one-line description}`` from the README's course-map table."""
    rows = re.findall(r"^\| \[(\d\d_\w+)\]\([^)]*\) \| ([^|]+) \|", readme.read_text(), flags=re.M)
    return {stem: desc.strip() for stem, desc in rows}


TEX = {"\\lambda": "λ", "\\epsilon": "ε", "\\gamma": "γ", "\\delta": "δ", "\\beta": "β", "\\pi": "π", "\\theta": "θ",
       "\\rho": "ρ", "$": ""}


def title_of(nb) -> str:
    """The first markdown heading of a notebook, without its leading '#', its math in plain Unicode (the index and the
    navigation bar are not typeset by MathJax)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    title = line[2:].strip()
                    for tex, text in TEX.items():
                        title = title.replace(tex, text)
                    return title
    return ""


def find_mathjax() -> Path | None:
    for folder in MATHJAX_DIRS:
        if folder and (Path(folder) / "MathJax.js").is_file():
            return Path(folder)
    return None


def copy_mathjax(source: Path, out: Path) -> str:
    """Copy the parts of MathJax the pages use into ``out/_static/mathjax``; return the URL pages load it from."""
    target = out / "_static" / "mathjax"
    for part in MATHJAX_PARTS:
        src, dst = source / part, target / part
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return "_static/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"


def nav_bar(prev: Path | None, nxt: Path | None, titles: dict[str, str]) -> str:
    def link(path: Path | None, arrow: str) -> str:
        if path is None:
            return "<span></span>"
        text = html.escape(titles.get(path.stem, path.stem))
        return f'<a href="{path.stem}.html">{arrow} {text}</a>' if arrow == "&larr;" else \
            f'<a href="{path.stem}.html">{text} {arrow}</a>'

    return (f'<nav class="minirl-nav">{link(prev, "&larr;")}<a href="index.html">minirl: the course</a>'
            f'{link(nxt, "&rarr;")}</nav>')


def render_notebook(path: Path, out: Path, mathjax_url: str | None = None, nav: str = "", title: str = "") -> Path:
    """Write ``out/<stem>.html`` from the notebook at ``path`` as it is stored (no execution); return the page."""
    nb = nbformat.read(path, as_version=4)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    if mathjax_url:
        exporter.mathjax_url = mathjax_url
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(path.parent), "name": path.stem}})
    # MathJax breaks lines to fit the width a table cell had before the math was typeset: equations in the Key
    # equations tables came out one symbol per line. Keep each formula on one line instead.
    body = re.sub(r"(linebreaks:\s*\{\s*automatic:\s*)true", r"\1false", body)
    body = LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)
    body = body.replace(f"<title>{path.stem}</title>", f"<title>{html.escape(title or path.stem)}</title>", 1)
    body = body.replace("</head>", STYLE + "\n</head>", 1)
    body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav, body, count=1)
    out.mkdir(parents=True, exist_ok=True)
    page = out / f"{path.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page


def unnumbered(title: str) -> str:
    """'06 · Generalized advantage estimation' -> 'Generalized advantage estimation' (the index shows the number)."""
    return re.sub(r"^\d\d\s*·\s*", "", title)


def write_index(pages: list[Path], titles: dict[str, str], out: Path, figures: list[str]) -> Path:
    descriptions = course_map()
    rows = "\n".join(
        f'<li><a href="{p.stem}.html"><span class="num">{p.stem[:2]}</span> '
        f'{html.escape(unnumbered(titles[p.stem]))}</a>'
        f'<div class="desc">{html.escape(descriptions.get(p.stem, ""))}</div></li>' for p in pages)
    gallery = "\n".join(f'<a href="figures/{name}"><img src="figures/{name}" alt="{html.escape(name)}" '
                        f'loading="lazy"><span>{html.escape(name[:-4])}</span></a>' for name in figures)
    index = out / "index.html"
    index.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>minirl: policy-gradient RL, from the policy gradient theorem to DeepSeek-R1</title>
<style>
body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 960px; margin: 2em auto; padding: 0 1em; color: #1f2328; }}
h1 {{ margin-bottom: 0.2em; }} .lead {{ color: #57606a; margin-top: 0; }}
ol.course {{ list-style: none; padding: 0; }}
ol.course li {{ padding: 0.6em 0.8em; border-bottom: 1px solid #e5e7eb; }}
ol.course a {{ font-weight: 600; color: #0b57a4; text-decoration: none; }}
ol.course a:hover {{ text-decoration: underline; }}
.num {{ display: inline-block; min-width: 2em; color: #57606a; font-variant-numeric: tabular-nums; }}
.desc {{ margin-left: 2.3em; color: #424a53; font-size: 0.95em; }}
.gallery {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 12px; }}
.gallery a {{ display: block; border: 1px solid #e5e7eb; padding: 6px; text-decoration: none; color: #57606a;
  font-size: 0.8em; }} .gallery img {{ width: 100%; height: 130px; object-fit: contain; }}
.gallery span {{ display: block; text-align: center; }}
</style></head>
<body>
<h1>minirl</h1>
<p class="lead">A notebook course in policy-gradient reinforcement learning, from the policy gradient theorem to GRPO
and DeepSeek-R1. Every notebook states an identity, checks it on numbers, then runs the algorithm for real. These
pages show the notebooks as they were last run in full mode; to run them yourself, <code>make lab</code>.</p>
<h2>The course, in reading order</h2>
<ol class="course">
{rows}
</ol>
<h2>Figures</h2>
<div class="gallery">
{gallery}
</div>
</body></html>
""", encoding="utf-8")
    return index


def build(out: Path, notebooks: list[Path]) -> list[Path]:
    """Render ``notebooks`` (in the order given) and the index into ``out``; return the pages written."""
    out.mkdir(parents=True, exist_ok=True)
    mathjax = find_mathjax()
    mathjax_url = copy_mathjax(mathjax, out) if mathjax else None
    figures = sorted(p.name for p in (ROOT / "figures").glob("*.png"))
    if figures:
        shutil.copytree(ROOT / "figures", out / "figures", dirs_exist_ok=True)
    titles = {p.stem: title_of(nbformat.read(p, as_version=4)) or p.stem for p in notebooks}
    pages = []
    for i, path in enumerate(notebooks):
        prev = notebooks[i - 1] if i > 0 else None
        nxt = notebooks[i + 1] if i + 1 < len(notebooks) else None
        pages.append(render_notebook(path, out, mathjax_url, nav_bar(prev, nxt, titles), titles[path.stem]))
        print(f"{path.name} -> {pages[-1].relative_to(out)}", flush=True)
    write_index(pages, titles, out, figures)
    print(f"{len(pages)} pages and index.html in {out} (MathJax: {'local copy' if mathjax else 'CDN'})")
    return pages


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site", help="output folder (default: site/)")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to render (default: notebooks/*.ipynb)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        sys.exit("no notebooks to render")
    build(args.out, [Path(p) for p in notebooks])


if __name__ == "__main__":
    main()
