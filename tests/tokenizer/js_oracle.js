// Encodes strings with @lenml/tokenizers (the transformers.js port), a second, independent oracle.
// usage: node js_oracle.js DEPS_NODE_MODULES MODEL_DIR IN.json OUT.json
//   IN.json: array of strings; OUT.json: array of id arrays (encode with add_special_tokens=true).
const path = require("path");
const fs = require("fs");
const [nodeModules, modelDir, inPath, outPath] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(nodeModules, "@lenml/tokenizers"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")),
});
const texts = JSON.parse(fs.readFileSync(inPath, "utf8"));
const ids = texts.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: true })));
fs.writeFileSync(outPath, JSON.stringify(ids));
