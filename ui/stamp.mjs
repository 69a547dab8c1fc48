// Writes dist-source.sha256: the hash of the sources dist/ was built from. The UI test recomputes
// it and fails when the committed dist/ is older than the sources (rebuild: npm run build).
import { writeFileSync } from "node:fs";
import { sourceHash } from "./source_hash.mjs";

writeFileSync(new URL("./dist-source.sha256", import.meta.url), sourceHash() + "\n");
