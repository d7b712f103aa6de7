/**
 * `npm test`: one real Engram for all the test files (starting one takes seconds), then node's
 * test runner on every compiled test file, then the service stopped; the runner's exit status.
 */
import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { startEngram } from "./service.js";

// Past this, something hangs (a stream left open keeps a test file's process alive): fail, and say so.
const LONGEST_RUN_MS = 300_000;

const here = fileURLToPath(new URL(".", import.meta.url));
const files = readdirSync(here)
  .filter((name) => name.endsWith(".test.js"))
  .map((name) => `${here}${name}`);

const running = await startEngram();
let status = 1;
try {
  const api = JSON.stringify({ ...running, stop: undefined });
  const runner = spawn(process.execPath, ["--test", "--test-concurrency=1", "--test-timeout=60000", ...files], {
    stdio: "inherit",
    env: { ...process.env, ENGRAM_TEST_API: api },
  });
  const stopRunner = () => runner.kill("SIGTERM");
  process.once("SIGINT", stopRunner);
  process.once("SIGTERM", stopRunner);
  const watchdog = setTimeout(() => {
    console.error(`the tests took over ${LONGEST_RUN_MS / 1000} s: stopped`);
    stopRunner();
  }, LONGEST_RUN_MS);
  status = await new Promise<number>((resolve) => runner.on("exit", (code) => resolve(code ?? 1)));
  clearTimeout(watchdog);
} finally {
  await running.stop();
}
process.exit(status);
