// Builds the dashboard into ../control/ui/dist, which is committed and embedded in the binary.
// The output is deterministic (fixed file names, no timestamps, no source maps), so
// TestAssetsAreBuilt can compare a fresh build with what is committed.
import * as esbuild from "esbuild";
import { mkdirSync, readFileSync, writeFileSync, rmSync } from "node:fs";

// SLUICE_UI_OUT builds elsewhere: TestAssetsAreBuilt compares such a build with dist.
const here = new URL(".", import.meta.url).pathname;
const out = (process.env.SLUICE_UI_OUT || here + "../control/ui/dist").replace(/\/?$/, "/");
process.chdir(here);
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

await esbuild.build({
  entryPoints: ["src/main.js"],
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2020"],
  legalComments: "none",
  outfile: out + "app.js",
  logLevel: "warning",
});

// One stylesheet: uPlot's and ours.
const css = readFileSync("node_modules/uplot/dist/uPlot.min.css", "utf8") + "\n" + readFileSync("src/app.css", "utf8");
writeFileSync(out + "app.css", css);
writeFileSync(out + "index.html", readFileSync("src/index.html", "utf8"));
