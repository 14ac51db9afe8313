"""clfjudge: classifier judges for LLM evaluation.

Importing the package is cheap and never touches the network; heavy libraries load on first use.
"""
__version__ = "0.1.0"
