"""posenc's version, in a module of its own: modules inside the package read it without importing the package
root (``posenc``), which imports them."""

__version__ = "0.1.0"
