# Sphinx settings for the course site: `make docs` builds nbs/ into docs/_build/html
# (sphinx-build -c docs nbs docs/_build/html; myst-nb keeps its copies in docs/_build/jupyter_execute).
# Offline by design: notebooks are rendered from their stored outputs, MathJax ships with the site.
import sys, tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS))   # nbdev_sphinx.py
_pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
_repo = _pyproject["project"]["urls"]["Repository"]

project = "minillm"
author = "minillm developers"
copyright = "minillm developers"
root_doc = "00_index"
extensions = ["myst_nb", "sphinx-mathjax-offline", "nbdev_sphinx"]
include_patterns = ["*.ipynb"]          # nbdev's rule: the top-level notebooks ...
exclude_patterns = ["_*", ".*"]         # ... without _ or . names

# Notebooks: stored outputs, never executed here.
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "attrs_inline", "attrs_block", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True
# MathJax (3.2, shipped by sphinx-mathjax-offline): textmacros makes \text{head\_dim} read as LaTeX does.
mathjax4_config = {"loader": {"load": ["[tex]/textmacros"]}, "tex": {"packages": {"[+]": ["textmacros"]}}}

html_theme = "sphinx_book_theme"
html_title = "minillm"
html_static_path = [str(DOCS / "_static")]
html_css_files = ["nbdev.css"]
html_show_sourcelink = False
html_copy_source = True          # the download button offers the notebook itself
html_sourcelink_suffix = ""
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": _repo,
    "repository_branch": "main",
    "path_to_docs": "nbs",
    "use_repository_button": True,
    "use_source_button": True,
    "use_download_button": True,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "show_navbar_depth": 1,
    "navigation_with_keys": False,
    "navbar_persistent": [],
}
pygments_style = "friendly"
