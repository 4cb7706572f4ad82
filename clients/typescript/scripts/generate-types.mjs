// Generates src/generated/openapi.ts, the request and answer types, from the
// project's openapi.yaml with openapi-typescript (pinned in package-lock.json).
// `npm run build` runs it first, so the library is always compiled against
// the spec it ships with; test/generated.test.mjs checks that the build is
// up to date with openapi.yaml.
//
// Usage: node scripts/generate-types.mjs [--stdout]
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { fileURLToPath, pathToFileURL } from "node:url";
import path from "node:path";
import openapiTS, { astToString } from "openapi-typescript";

const here = path.dirname(fileURLToPath(import.meta.url));
export const SPEC = path.resolve(here, "../../../openapi.yaml");
export const OUT = path.resolve(here, "../src/generated/openapi.ts");

/** The text of src/generated/openapi.ts for the spec at `spec`. */
export async function generate(spec = SPEC) {
  const text = await readFile(spec);
  const sha = createHash("sha256").update(text).digest("hex");
  const ast = await openapiTS(pathToFileURL(spec), {
    // Request bodies may leave out fields that have a default.
    defaultNonNullable: false,
  });
  return (
    "// Generated from openapi.yaml by scripts/generate-types.mjs (openapi-typescript).\n" +
    "// Do not edit: `npm run build` writes it again.\n" +
    `// openapi.yaml sha256: ${sha}\n\n` +
    astToString(ast) +
    "\n/** The sha256 of the openapi.yaml these types were generated from. */\n" +
    `export const SPEC_SHA256 = "${sha}";\n`
  );
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const out = await generate();
  if (process.argv.includes("--stdout")) {
    process.stdout.write(out);
  } else {
    await mkdir(path.dirname(OUT), { recursive: true });
    let old = null;
    try {
      old = await readFile(OUT, "utf8");
    } catch {
      // first build
    }
    if (old !== out) await writeFile(OUT, out);
  }
}
