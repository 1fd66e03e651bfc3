# PERSIA's test/utils.py helper, as its tests import it (``from .utils import random_port``).
import random


def random_port(start: int = 10000, end: int = 65535) -> int:
    return random.randint(start, end)
