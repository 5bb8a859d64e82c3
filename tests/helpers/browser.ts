/**
 * A headless Chromium driven over the DevTools protocol (a WebSocket, no npm
 * packages): open a page, evaluate expressions in it, and collect every
 * console error, uncaught exception and failed load the page produces.
 */

/** Where Chromium may be: `$HALFSTEP_CHROMIUM` first, then the usual names on PATH. */
const CANDIDATES = [
  "chromium",
  "chromium-browser",
  "google-chrome",
  "google-chrome-stable",
];

/** The Chromium executable to use, or null when none is installed. */
export function findChromium(): string | null {
  const fromEnv = Deno.env.get("HALFSTEP_CHROMIUM");
  if (fromEnv) return fromEnv;
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    for (const name of CANDIDATES) {
      try {
        if (Deno.statSync(`${dir}/${name}`).isFile) return `${dir}/${name}`;
      } catch {
        // not here
      }
    }
  }
  return null;
}

/** A page in a headless browser. */
export interface BrowserPage {
  /** Console errors, uncaught exceptions and failed loads seen so far. */
  readonly problems: string[];
  /** Loads `url` and waits for its load event. */
  open(url: string): Promise<void>;
  /** Evaluates `expression` in the page (awaiting a promise) and returns its JSON value. */
  evaluate<T>(expression: string): Promise<T>;
  /** A PNG of the page as it is now (handy when a browser test fails). */
  screenshot(): Promise<Uint8Array>;
  /** Closes the browser and removes its profile. */
  close(): Promise<void>;
}

interface DevtoolsMessage {
  id?: number;
  method?: string;
  // deno-lint-ignore no-explicit-any
  params?: any;
  // deno-lint-ignore no-explicit-any
  result?: any;
  error?: { message: string };
}

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`browser: timed out after ${ms} ms ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Reads Chromium's stderr until it prints its DevTools WebSocket address. */
async function devtoolsAddress(stderr: ReadableStream<Uint8Array>, log: string[]): Promise<string> {
  const lines = stderr.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  while (true) {
    const { value, done } = await lines.read();
    if (done) throw new Error(`browser: Chromium exited before DevTools started:\n${buffered}`);
    buffered += value;
    const match = buffered.match(/DevTools listening on (ws:\/\/\S+)/);
    if (match) {
      // keep draining so that Chromium never blocks on a full pipe
      (async () => {
        for (let r = await lines.read(); !r.done; r = await lines.read()) log.push(r.value);
      })().catch(() => {});
      return match[1];
    }
  }
}

/** Options of {@link launchChromium}. */
export interface LaunchOptions {
  /**
   * Enable WebGPU (default true). False starts Chromium as a browser without
   * WebGPU looks to a page, to test what the page says then.
   */
  webgpu?: boolean;
}

/** The flags that give headless Chromium on Linux a WebGPU adapter (SwiftShader without a GPU). */
const WEBGPU_FLAGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan"];
/** The flags that take WebGPU away (navigator.gpu stays, its adapter is null). */
const NO_WEBGPU_FLAGS = ["--disable-features=WebGPU,Vulkan"];

/**
 * Starts headless Chromium (WebGPU enabled unless asked otherwise) and opens one blank page.
 *
 * @param executable the Chromium binary (see {@link findChromium})
 * @param options whether the browser has WebGPU
 * @returns the page, ready for {@link BrowserPage.open}
 */
export async function launchChromium(
  executable: string,
  options: LaunchOptions = {},
): Promise<BrowserPage> {
  const profile = await Deno.makeTempDir({ prefix: "halfstep-chromium-" });
  const child = new Deno.Command(executable, {
    args: [
      "--headless",
      "--no-sandbox", // CI runs as root
      "--disable-dev-shm-usage",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--window-size=1100,1000",
      ...(options.webgpu ?? true ? WEBGPU_FLAGS : NO_WEBGPU_FLAGS),
      "--remote-debugging-port=0",
      `--user-data-dir=${profile}`,
      "about:blank",
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const chromiumLog: string[] = [];
  const close = async () => {
    try {
      child.kill("SIGTERM");
    } catch {
      // already gone
    }
    await child.status;
    await Deno.remove(profile, { recursive: true }).catch(() => {});
  };
  try {
    const browserUrl = await withTimeout(
      devtoolsAddress(child.stderr, chromiumLog),
      30_000,
      "starting",
    );
    const port = new URL(browserUrl).port;
    const targets: { type: string; webSocketDebuggerUrl: string }[] = await withTimeout(
      fetch(`http://127.0.0.1:${port}/json/list`).then((r) => r.json()),
      10_000,
      "listing pages",
    );
    const page = targets.find((t) => t.type === "page");
    if (!page) throw new Error("browser: Chromium opened no page");
    return await connect(page.webSocketDebuggerUrl, close);
  } catch (error) {
    await close();
    throw error;
  }
}

async function connect(url: string, closeBrowser: () => Promise<void>): Promise<BrowserPage> {
  const socket = new WebSocket(url);
  await withTimeout(
    new Promise((resolve, reject) => {
      socket.onopen = resolve;
      socket.onerror = () => reject(new Error(`browser: cannot connect to ${url}`));
    }),
    10_000,
    "connecting",
  );
  const pending = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  const listeners = new Map<string, (params: unknown) => void>();
  const problems: string[] = [];
  let nextId = 1;
  socket.onmessage = (event) => {
    const message: DevtoolsMessage = JSON.parse(event.data);
    if (message.id !== undefined) {
      const call = pending.get(message.id);
      pending.delete(message.id);
      if (message.error) call?.reject(new Error(`browser: ${message.error.message}`));
      else call?.resolve(message.result);
      return;
    }
    const p = message.params;
    if (message.method === "Runtime.exceptionThrown") {
      const details = p.exceptionDetails;
      problems.push(`uncaught: ${details.exception?.description ?? details.text}`);
    } else if (message.method === "Runtime.consoleAPICalled" && p.type === "error") {
      problems.push(
        `console.error: ${
          p.args.map((a: { value?: unknown; description?: string }) => a.value ?? a.description)
            .join(" ")
        }`,
      );
    } else if (message.method === "Log.entryAdded" && p.entry.level === "error") {
      problems.push(`${p.entry.source}: ${p.entry.text} ${p.entry.url ?? ""}`.trim());
    }
    if (message.method) listeners.get(message.method)?.(p);
  };
  // deno-lint-ignore no-explicit-any
  const send = (method: string, params: Record<string, unknown> = {}): Promise<any> => {
    const id = nextId++;
    socket.send(JSON.stringify({ id, method, params }));
    return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
  };
  await send("Runtime.enable");
  await send("Log.enable");
  await send("Page.enable");
  return {
    problems,
    async open(pageUrl) {
      const loaded = new Promise((resolve) => listeners.set("Page.loadEventFired", resolve));
      const navigation = await send("Page.navigate", { url: pageUrl });
      if (navigation.errorText) {
        throw new Error(`browser: cannot open ${pageUrl}: ${navigation.errorText}`);
      }
      await withTimeout(loaded, 30_000, `loading ${pageUrl}`);
    },
    async evaluate<T>(expression: string): Promise<T> {
      const reply = await send("Runtime.evaluate", {
        expression,
        awaitPromise: true,
        returnByValue: true,
      });
      if (reply.exceptionDetails) {
        throw new Error(
          `browser: ${expression} threw ${reply.exceptionDetails.exception?.description}`,
        );
      }
      return reply.result.value as T;
    },
    async screenshot() {
      const { data } = await send("Page.captureScreenshot", { format: "png" });
      return Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
    },
    async close() {
      socket.close();
      await closeBrowser();
    },
  };
}
