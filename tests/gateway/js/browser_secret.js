// The browser page against a server with API keys: the key typed into the page is traded
// for a short-lived client secret, the socket opens with that, and the key is kept in no
// storage. Usage: node browser_secret.js URL KEY   (prints a JSON summary on stdout)
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

const [url, key] = process.argv.slice(2);

async function main() {
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "tokenwire-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = context.pages()[0] || await context.newPage();
    const sockets = [];
    page.on("websocket", (ws) => sockets.push(ws.url()));
    // What an older page left behind is cleared too.
    await page.addInitScript((k) => {
      if (!sessionStorage.getItem("seeded")) {
        localStorage.setItem("tokenwire.key", k); sessionStorage.setItem("seeded", "1");
      }
    }, key);
    await page.goto(url);
    await page.fill("#key", key);
    await page.dispatchEvent("#key", "change");
    await page.waitForFunction(() => document.getElementById("status").textContent === "online",
                               null, { timeout: 60000 });
    const storage = await page.evaluate(() => JSON.stringify({ ...localStorage, ...sessionStorage }));
    console.log(JSON.stringify({ online: true, storage, sockets }));
  } finally {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
