/** README's TypeScript example runs as written, against the test service, and prints what it says. */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { engramApi, tokenFor } from "./service.js";
import { someone } from "./support.js";

const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));
const README = join(PACKAGE, "..", "..", "README.md");

/** The ```ts block of README marked `(example: <name>)`. */
function example(name: string): string {
  const blocks = [...readFileSync(README, "utf8").matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
  const found = blocks.filter((block) => block.includes(`(example: ${name})`));
  assert.equal(found.length, 1, `one README example named ${name}`);
  return found[0] ?? "";
}

test("README's TypeScript example runs and prints what its comment says", async () => {
  const api = await engramApi();
  const program = example("typescript").replace("http://127.0.0.1:8788", api.baseUrl);
  // In the package's folder, the example's `import ... from "engram-ledger"` finds the package
  // itself by its exports, as an application's would; the example is plain JavaScript too.
  const file = join(PACKAGE, `example-${crypto.randomUUID().slice(0, 8)}.mjs`);
  writeFileSync(file, program);
  try {
    const ran = spawnSync(process.execPath, [file], {
      env: { ...process.env, ENGRAM_TOKEN: tokenFor(api, someone("readme")) },
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(ran.status, 0, ran.stderr);
    const said = /console\.log\(.*\); \/\/ (.*)/.exec(program)?.[1];
    assert.ok(said, "the example says what it prints");
    assert.equal(ran.stdout.trim(), said);
  } finally {
    rmSync(file, { force: true });
  }
});
