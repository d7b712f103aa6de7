/** The types are the OpenAPI document's: `src/schema.ts` is what `npm run generate` makes of it now. */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));

test("src/schema.ts is generated from docs/openapi.json as it stands", () => {
  // openapi-typescript's --check: the generate script's own command, compared with the file.
  const checked = spawnSync("npm", ["run", "--silent", "generate", "--", "--check"], { cwd: PACKAGE, encoding: "utf8" });
  assert.equal(
    checked.status,
    0,
    "src/schema.ts differs from docs/openapi.json: run `npm run generate` in clients/typescript " +
      "(after `engram openapi --out docs/openapi.json` at the repository's root, if the contracts changed)\n" +
      checked.stderr,
  );
});
