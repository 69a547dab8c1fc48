// The sha256 of everything dist/ is built from, over sorted relative paths and contents.
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL(".", import.meta.url));
const inputs = ["index.html", "package.json", "tsconfig.json", "vite.config.ts", "src"];

function files(path) {
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path).flatMap((name) => files(join(path, name)));
}

export function sourceHash() {
  const hash = createHash("sha256");
  const all = inputs.flatMap((p) => files(join(root, p))).map((p) => relative(root, p)).sort();
  for (const name of all) {
    hash.update(name + "\0");
    hash.update(readFileSync(join(root, name)));
    hash.update("\0");
  }
  return hash.digest("hex");
}
