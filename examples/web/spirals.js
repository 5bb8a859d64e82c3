// The browser demo: trains a small MLP on two spirals with the esbuild bundle
// of halfstep (`deno task bundle` writes dist/halfstep.js) and draws the loss
// and the decision regions as it learns. Plain JavaScript, so a browser loads
// it as it is. Its progress is published on `globalThis.halfstepDemo` for
// anyone watching the page (the headless test in tests/ does).
//
// URL parameters: `steps` (default 400), `seed` (default 1), `f16` (initGpu's
// f16 option: auto, require or off; default auto), `capture` (off: train
// uncaptured; by default the step is captured, recorded in its first steps and
// then replayed without its JavaScript).
import {
  AdamW,
  AmpTrainer,
  crossEntropy,
  GELU,
  initGpu,
  Linear,
  noGrad,
  Sequential,
  softmax,
  Tensor,
  tidy,
} from "../../dist/halfstep.js";

const POINTS_PER_CLASS = 256;
const GRID = 40; // decision-region resolution, GRID × GRID cells
const LOG_EVERY = 5; // steps between loss reads (each read is a GPU sync)
const FIELD_EVERY = 50; // steps between decision-region redraws

const params = new URLSearchParams(location.search);
const totalSteps = positiveInt(params.get("steps"), 400);
const seed = positiveInt(params.get("seed"), 1);

/** What the page has done so far; read by tests and by curious users. */
const demo = {
  status: "loading",
  message: "loading…",
  adapter: "",
  /** Whether the adapter is a software one (SwiftShader, lavapipe, ...). */
  software: false,
  /** The page's heading, which names the adapter. */
  heading: "",
  f16: false,
  steps: 0,
  totalSteps,
  losses: [],
  accuracy: null,
  scale: null,
  skippedSteps: null,
  msPerStep: null,
  /** Whether the step is captured, and the steps replayed so far. */
  captured: false,
  replayedSteps: 0,
  error: null,
};
globalThis.halfstepDemo = demo;

const statusLine = document.getElementById("status");
const statsBlock = document.getElementById("stats");
const lossCanvas = document.getElementById("loss");
const fieldCanvas = document.getElementById("field");

function positiveInt(text, fallback) {
  const value = Number(text);
  return Number.isInteger(value) && value > 0 ? value : fallback;
}

function setStatus(status, message) {
  demo.status = status;
  demo.message = message;
  statusLine.textContent = message;
  statusLine.className = status === "error" || status === "no-webgpu" ? "error" : "";
}

/** Two interleaved spirals in [-1, 1]², with a little seeded noise. */
function makeSpirals(perClass, seed) {
  let state = seed >>> 0;
  const noise = () => {
    // mulberry32: a tiny seeded generator, enough for jitter
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) / 4294967296 - 0.5) * 0.08;
  };
  const xs = new Float32Array(perClass * 2 * 2);
  const labels = new Int32Array(perClass * 2);
  for (let c = 0; c < 2; c++) {
    for (let i = 0; i < perClass; i++) {
      const row = c * perClass + i;
      const r = 0.05 + 0.9 * (i / perClass);
      const angle = 3.5 * Math.PI * (i / perClass) + c * Math.PI;
      xs[row * 2] = r * Math.cos(angle) + noise();
      xs[row * 2 + 1] = r * Math.sin(angle) + noise();
      labels[row] = c;
    }
  }
  return { xs, labels, count: perClass * 2 };
}

function drawLoss(losses) {
  const ctx = lossCanvas.getContext("2d");
  const { width, height } = lossCanvas;
  ctx.clearRect(0, 0, width, height);
  if (losses.length < 2) return;
  const top = Math.max(...losses.map((p) => p.loss));
  ctx.strokeStyle = "#1565c0";
  ctx.lineWidth = 2;
  ctx.beginPath();
  losses.forEach(({ step, loss }, i) => {
    const x = 30 + (width - 40) * (step / totalSteps);
    const y = height - 20 - (height - 30) * (loss / top);
    if (i === 0) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#555";
  ctx.fillText(top.toFixed(3), 2, 14);
  ctx.fillText("0", 2, height - 20);
  ctx.fillText(`step ${totalSteps}`, width - 60, height - 4);
}

async function drawField(model, data) {
  const cells = new Float32Array(GRID * GRID * 2);
  for (let gy = 0; gy < GRID; gy++) {
    for (let gx = 0; gx < GRID; gx++) {
      const i = gy * GRID + gx;
      cells[i * 2] = -1 + (2 * (gx + 0.5)) / GRID;
      cells[i * 2 + 1] = 1 - (2 * (gy + 0.5)) / GRID;
    }
  }
  const probabilities = noGrad(() =>
    tidy(() => softmax(model.forward(Tensor.from(cells, [GRID * GRID, 2]))))
  );
  const p = await probabilities.read();
  probabilities.dispose();
  const ctx = fieldCanvas.getContext("2d");
  const cell = fieldCanvas.width / GRID;
  for (let i = 0; i < GRID * GRID; i++) {
    const p1 = p[i * 2 + 1];
    ctx.fillStyle = `rgb(${Math.round(255 - 80 * p1)}, ${Math.round(200 + 20 * (1 - p1))}, ${
      Math.round(175 + 80 * p1)
    })`;
    ctx.fillRect((i % GRID) * cell, Math.floor(i / GRID) * cell, cell + 1, cell + 1);
  }
  for (let i = 0; i < data.count; i++) {
    ctx.fillStyle = data.labels[i] === 0 ? "#c62828" : "#1565c0";
    const x = (data.xs[i * 2] + 1) / 2 * fieldCanvas.width;
    const y = (1 - data.xs[i * 2 + 1]) / 2 * fieldCanvas.height;
    ctx.fillRect(x - 1.5, y - 1.5, 3, 3);
  }
  let correct = 0;
  const logits = noGrad(() => model.forward(Tensor.from(data.xs, [data.count, 2])));
  const values = await logits.read();
  logits.dispose();
  for (let i = 0; i < data.count; i++) {
    if ((values[i * 2 + 1] > values[i * 2] ? 1 : 0) === data.labels[i]) correct++;
  }
  demo.accuracy = correct / data.count;
}

function showStats() {
  const last = demo.losses.at(-1);
  statsBlock.textContent = [
    `adapter        ${demo.adapter} (shader-f16: ${demo.f16 ? "yes" : "no, training in f32"})`,
    `step           ${demo.steps} / ${totalSteps}`,
    `loss           ${last ? last.loss.toFixed(4) : "-"}`,
    `accuracy       ${demo.accuracy === null ? "-" : (100 * demo.accuracy).toFixed(1) + "%"}`,
    `loss scale     ${demo.scale ?? "-"}   skipped steps ${demo.skippedSteps ?? "-"}`,
    `ms per step    ${demo.msPerStep === null ? "-" : demo.msPerStep.toFixed(1)}`,
  ].join("\n");
}

/**
 * The heading names the adapter the page really trains on: a software one
 * (SwiftShader, lavapipe, llvmpipe: the browser found no usable GPU) is said
 * to be one, never "your GPU".
 */
function showAdapter(gpu) {
  const name = demo.adapter;
  demo.software = gpu.adapterInfo.isFallbackAdapter ||
    /swiftshader|llvmpipe|lavapipe|software|basic render/i.test(name);
  const where = demo.software
    ? `on ${name}, a software adapter (the CPU: the browser gave no GPU)`
    : `on ${name}`;
  demo.heading = `halfstep: two spirals, trained ${where}`;
  document.getElementById("title").textContent = demo.heading;
}

/** What a browser user can do when the page finds no WebGPU. */
const ENABLE_WEBGPU = "Open it in a browser with WebGPU: a recent Chrome, Edge or Safari " +
  "(on Linux, Chrome needs chrome://flags/#enable-unsafe-webgpu and #enable-vulkan; " +
  "chrome://gpu tells whether WebGPU is on).";

async function main() {
  // Only these two are "no WebGPU"; anything the library throws after them is an error.
  if (!("gpu" in navigator)) {
    const secure = isSecureContext ? "" : " WebGPU needs https or localhost, and this page is " +
      "neither: open it from http://127.0.0.1 or http://localhost.";
    setStatus(
      "no-webgpu",
      `This browser has no WebGPU (navigator.gpu is missing).${secure} ` +
        ENABLE_WEBGPU,
    );
    return;
  }
  setStatus("starting", "starting WebGPU…");
  if (!(await navigator.gpu.requestAdapter())) {
    setStatus(
      "no-webgpu",
      "This browser has WebGPU but gave no adapter: no adapter was found (WebGPU is " +
        `disabled, or this GPU is blocklisted). ${ENABLE_WEBGPU}`,
    );
    return;
  }
  // No matmul tuning: it measures every tiling once per adapter (43 s, in
  // silence, on SwiftShader on the first visit), and this model's products are tiny.
  const gpu = await initGpu({ f16: params.get("f16") ?? "auto", matmulTiling: "default" });
  demo.adapter = gpu.adapterName || "unnamed adapter";
  demo.f16 = gpu.f16;
  showAdapter(gpu);
  const data = makeSpirals(POINTS_PER_CLASS, seed);
  const x = Tensor.from(data.xs, [data.count, 2]);
  const y = Tensor.from(data.labels, [data.count], { dtype: "i32" });
  const model = new Sequential(
    new Linear(2, 64, { seed }),
    new GELU(),
    new Linear(64, 64, { seed: seed + 1 }),
    new GELU(),
    new Linear(64, 2, { seed: seed + 2 }),
  );
  const trainer = new AmpTrainer(model, new AdamW(model.parameters(), { lr: 0.01 }));
  const loss = (x, y) => crossEntropy(model.forward(x), y);
  const captured = params.get("capture") === "off" ? null : trainer.capture(loss);
  demo.captured = captured !== null;
  setStatus("training", "training…");
  showStats();
  let since = performance.now();
  for (let step = 1; step <= totalSteps; step++) {
    const l = captured ? captured.run(x, y) : trainer.step(() => loss(x, y));
    demo.replayedSteps = captured?.stats.replayed ?? 0;
    if (step % LOG_EVERY === 0 || step === 1 || step === totalSteps) {
      demo.losses.push({ step, loss: await l.item() }); // the sync point
      demo.msPerStep = (performance.now() - since) / (step === 1 ? 1 : LOG_EVERY);
      since = performance.now();
      demo.scale = await trainer.scaler.getScale();
      demo.skippedSteps = await trainer.scaler.skippedSteps();
    }
    l.dispose();
    demo.steps = step;
    if (step % FIELD_EVERY === 0 || step === totalSteps) await drawField(model, data);
    if (step % LOG_EVERY === 0) {
      drawLoss(demo.losses);
      showStats();
    }
  }
  drawLoss(demo.losses);
  showStats();
  setStatus("done", `done: ${totalSteps} steps, accuracy ${(100 * demo.accuracy).toFixed(1)}%`);
  x.dispose();
  y.dispose();
  trainer.dispose();
  gpu.destroy();
}

main().catch((error) => {
  demo.error = String(error?.stack ?? error);
  setStatus("error", `error: ${error?.name ?? "Error"}: ${error?.message ?? error}`);
  console.error(error);
});
