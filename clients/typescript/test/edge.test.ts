/**
 * The core runs where only fetch and the web's APIs are: nothing it loads, its dependencies
 * included, imports a Node module. (`ai` and `zod`, behind `engram-ledger/ai`, are the
 * application's own.)
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const IMPORT = /(?:^|[\s;])(?:import|export)\s[^'"]*?from\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;
const NODE = new Set(builtinModules);
const APPLICATIONS = new Set(["ai", "zod"]);

/** Every module file `entry` loads, followed through relative and package imports, with what each imports. */
function loaded(entry: string): Map<string, string[]> {
  const seen = new Map<string, string[]>();
  const queue = [import.meta.resolve(entry)];
  while (queue.length) {
    const url = queue.pop() as string;
    if (seen.has(url)) continue;
    const specifiers = [...readFileSync(fileURLToPath(url), "utf8").matchAll(IMPORT)].map((m) => m[1] ?? m[2] ?? "");
    seen.set(url, specifiers);
    for (const specifier of specifiers) {
      if (specifier.startsWith("node:") || NODE.has(specifier) || APPLICATIONS.has(specifier)) continue;
      // A package of the client's is found from here as from the client: one node_modules.
      queue.push(specifier.startsWith(".") ? new URL(specifier, url).href : import.meta.resolve(specifier));
    }
  }
  return seen;
}

test("the client and its tools load no Node module", () => {
  for (const entry of ["engram-ledger", "engram-ledger/ai"]) {
    const files = loaded(entry);
    assert.ok(files.size > 1, `${entry} is followed into its modules`);
    for (const [file, specifiers] of files) {
      const node = specifiers.filter((s) => s.startsWith("node:") || NODE.has(s));
      assert.deepEqual(node, [], `${file} imports Node modules`);
    }
  }
});
