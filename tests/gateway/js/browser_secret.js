// The browser page against a server with API keys: the key typed into the page is traded
// for a short-lived client secret, the socket opens with that, and the key is kept in no
// storage. Usage: node browser_secret.js URL KEY   (prints a JSON summary on stdout)
"use strict";
const { withPage } = require("./chromium_page");

const [url, key] = process.argv.slice(2);

async function main() {
  await withPage(async (page) => {
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
  }, {
    args: ["--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

main().catch((e) => { console.error(e); process.exit(1); });
