"""qkv's version, in a module of its own so that any part of the package can read it without importing the
package's front door (:mod:`qkv`)."""

__version__ = "0.1.0"
