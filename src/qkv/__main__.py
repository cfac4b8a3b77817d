"""``python -m qkv`` is the ``qkv`` command (torchrun runs it as ``torchrun ... -m qkv train``)."""

import sys

from qkv.cli import main

sys.exit(main())
