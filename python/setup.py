# The wheel carries a compiled library (megamoe/lib/libmegamoe.so.0), so it is
# tagged for this platform, not "any"; and it is refused without that library
# (stage it first: `make -j python` in the repository root).
import os

from setuptools import setup
from setuptools.dist import Distribution

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megamoe", "lib", "libmegamoe.so.0")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


if not os.path.isfile(_LIB):
    raise SystemExit(f"megamoe: {_LIB} is missing: run `make -j python` in the repository root first "
                     "(it builds libmegamoe.so and stages it into the package)")

setup(distclass=BinaryDistribution)
