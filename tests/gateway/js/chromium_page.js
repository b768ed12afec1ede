// Headless Chromium (Debian's) for the browser page's tests: `run(page)` on one page of a
// throwaway profile, closed and removed however `run` ends. `options` add launch
// arguments (`args`) and Playwright's context options (a viewport, say).
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"];

async function withPage(run, { args = [], ...options } = {}) {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "tokenwire-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    args: [...ARGS, ...args], ...options,
  });
  try {
    return await run(context.pages()[0] || await context.newPage());
  } finally {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
}

module.exports = { withPage };
