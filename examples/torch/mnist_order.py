"""examples/mnist.ts's data order in Python, so a run goes on with the same batches.

mnist.ts shuffles its training images at the start of every epoch with a
Fisher-Yates shuffle drawn from halfstep's counter-based ``RandomGenerator``
(``gpu/random.ts``: two rounds of the lowbias32 hash over (key, counter)).
A run file records the generator's seed and offset before the epoch in
progress drew its order, and how many steps into that epoch the run is
(``extra.shuffler``, ``extra.position``); :class:`DataOrder` goes on from
there and says where it stopped, in the same terms.
"""

import numpy as np

_M32 = 0xFFFFFFFF
_COUNTERS_PER_KEY = 2**32


def _hash_u32(x):
    """One round of lowbias32 on uint64 arrays holding u32 values."""
    x = x & _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def _hash(value):
    return int(_hash_u32(np.array([value], dtype=np.uint64))[0])


class RandomGenerator:
    """halfstep's ``RandomGenerator``: a seeded stream whose state is (seed, offset)."""

    def __init__(self, seed, offset=0):
        if not (isinstance(seed, int) and isinstance(offset, int) and seed >= 0 and offset >= 0):
            raise ValueError(f"a random generator's seed and offset must be integers >= 0, not {seed!r}, {offset!r}")
        self.seed, self.offset = seed, offset

    def _key(self, block):
        low = _hash(self.seed % _COUNTERS_PER_KEY)
        high = _hash((self.seed // _COUNTERS_PER_KEY + block * 0x632BE5AB) & _M32)
        return _hash(low ^ high)

    def uniform(self, count):
        """``count`` uniform numbers in [0, 1) with 24 random bits, as ``rng.uniform(count)``."""
        start = self.offset
        within = start % _COUNTERS_PER_KEY
        if within + count > _COUNTERS_PER_KEY:  # a block never straddles two keys
            start += _COUNTERS_PER_KEY - within
        self.offset = start + count
        key = self._key(start // _COUNTERS_PER_KEY)
        counters = np.arange(count, dtype=np.uint64) + np.uint64(start % _COUNTERS_PER_KEY)
        mixed = _hash_u32(counters + np.uint64((key * 0x9E3779B9) & _M32))
        bits = _hash_u32(mixed ^ np.uint64(key))
        return (bits >> 8).astype(np.float64) / 16777216


def shuffle(count, rng):
    """mnist_batches.ts's ``shuffle``: a Fisher-Yates order of 0..count-1 from ``rng``."""
    order = np.arange(count, dtype=np.int64)
    draws = rng.uniform(count)
    for i in range(count - 1, 0, -1):
        j = int(draws[i] * (i + 1))
        order[i], order[j] = order[j], order[i]
    return order


class DataOrder:
    """The global batches of a mnist.ts run, from where its record says it stands.

    ``images`` training images (the first ones), ``batch`` a step; each epoch
    has ``images // batch`` steps (the last partial batch is dropped).
    """

    def __init__(self, images, batch, seed, offset, epoch, position):
        self.images, self.batch = images, batch
        self.steps_per_epoch = images // batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"a batch of {batch} is more than the run's {images} images")
        if not 0 <= position < self.steps_per_epoch:
            raise ValueError(f"position {position} is not a step of an epoch of {self.steps_per_epoch}")
        self.seed, self.offset = seed, offset  # the generator before the epoch in progress
        self.epoch, self.position = epoch, position  # epochs finished, steps into the next
        self._order, self._after = None, None

    def next_batch(self):
        """The image indices of the next step's global batch (then the position moves on)."""
        if self._order is None:
            rng = RandomGenerator(self.seed, self.offset)
            self._order, self._after = shuffle(self.images, rng), rng.offset
        rows = self._order[self.position * self.batch : (self.position + 1) * self.batch]
        self.position += 1
        if self.position == self.steps_per_epoch:  # the epoch is over: the next draws its order
            self.epoch, self.position, self.offset, self._order = self.epoch + 1, 0, self._after, None
        return rows

    def record(self):
        """Where the run stands, as mnist.ts's run record says it."""
        return {"epoch": self.epoch, "position": self.position,
                "shuffler": {"seed": self.seed, "offset": self.offset}}
