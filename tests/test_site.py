"""`make site`: tools/build_site.py renders stored notebooks to static HTML (no execution) and an index."""

import base64
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG = base64.b64decode(  # a 1 x 1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def site():
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_notebook_renders_with_embedded_images_and_page_links(site, tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "dot.png").write_bytes(PNG)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 99 · A test page\n\n$J(\\theta)$ ![a dot](../figures/dot.png) [next]"
                                      "(01_value_vs_policy.ipynb) [a section](02_policy_gradient_theorem.ipynb#x)"),
        nbformat.v4.new_code_cell("1 + 1", outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"},
                                                                           execution_count=1)]),
    ]
    path = tmp_path / "notebooks" / "99_test.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    page = site.render_notebook(path, tmp_path / "out", nav='<nav class="minirl-nav">NAV</nav>', title="99 · A test")
    text = page.read_text()
    assert page.name == "99_test.html" and "<title>99 · A test</title>" in text
    assert "data:image/png;base64," in text  # the markdown image is inside the page: it works offline
    assert 'href="01_value_vs_policy.html"' in text and 'href="02_policy_gradient_theorem.html#x"' in text
    assert ">NAV</nav>" in text and "automatic: false" in text
    assert "jp-OutputArea-output" in text  # the stored output is on the page (nothing was executed)


def test_the_index_lists_the_course_in_order(site, tmp_path):
    descriptions = site.course_map()
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert list(descriptions) == stems, "the README's course map must list every notebook, in order"
    pages = [tmp_path / f"{s}.html" for s in stems[:2]]
    index = site.write_index(pages, {s: f"title of {s}" for s in stems[:2]}, tmp_path, ["00_bandit.png"])
    text = index.read_text()
    assert text.index(f'href="{stems[0]}.html"') < text.index(f'href="{stems[1]}.html"')
    assert descriptions[stems[0]] in text and 'src="figures/00_bandit.png"' in text
