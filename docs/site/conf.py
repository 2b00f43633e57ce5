# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sphinx configuration of the docs site (`make docs`, tests/docs/run.sh).

The build is offline: no intersphinx (the few labels of Ansible's own docs that antsibull-docs' pages
reference are defined in reference/ansible.rst), no remote theme, font or script.
"""

from __future__ import annotations

project = "multinode.vllm"
copyright = "multinode.vllm contributors"  # noqa: A001 (Sphinx's name)
title = "multinode.vllm"
html_short_title = "multinode.vllm"
html_title = "multinode.vllm documentation"

extensions = ["myst_parser", "sphinx_antsibull_ext"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# GitHub-style anchors for the guides' links to each other (benchmarks.md#...).
myst_heading_anchors = 3

pygments_style = "ansible"
highlight_language = "YAML+Jinja"

html_theme = "sphinx_ansible_theme"
# No links to ansible.com in a top bar, no remote sidebar image or ads.
html_theme_options = {
    "topbar_links": {},
    "show_extranav": False,
    "show_rtd_ethical_ads": False,
    "documentation_home_url": "index.html",
}
html_show_sphinx = False
display_version = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False

default_role = "any"
nitpicky = True
