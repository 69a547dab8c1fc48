// Renders chat templates with @huggingface/jinja (the JavaScript port HF maintains), as a second
// oracle for tests/chat/jinja_js_test.cpp. Usage: node jinja_oracle.mjs ROOT JOBS.json
//   JOBS.json: [{"template": source, "context": {...}, "now": "YYYY-MM-DD HH:MM:SS"}, ...]
// Prints a JSON array, one {"output": text} or {"error": message} per job. The port's strftime_now
// reads `new Date()`; Date is replaced so that it sees the job's fixed local "now".
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [root, jobsPath] = process.argv.slice(2);
const modulePath = `${root}/deps/node_modules/@huggingface/jinja/dist/index.js`;
let Template;
try {
  ({ Template } = await import(pathToFileURL(modulePath).href));
} catch (e) {
  console.error(`cannot load ${modulePath}: ${e.message}; run scripts/setup.sh`);
  process.exit(3);
}
const RealDate = Date;
let fixedMillis = RealDate.now();
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length) super(...args);
    else super(fixedMillis);
  }
  static now() {
    return fixedMillis;
  }
};
function setNow(now) {
  const [date, time] = now.split(" ");
  const [Y, m, d] = date.split("-").map(Number);
  const [H, M, S] = time.split(":").map(Number);
  fixedMillis = new RealDate(Y, m - 1, d, H, M, S).getTime();
}
const jobs = JSON.parse(readFileSync(jobsPath, "utf8"));
const cache = new Map();
const results = jobs.map((job) => {
  try {
    let template = cache.get(job.template);
    if (!template) {
      template = new Template(job.template);
      cache.set(job.template, template);
    }
    setNow(job.now);
    return { output: template.render(job.context) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
