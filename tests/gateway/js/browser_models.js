// The browser page's model picker on a server with several models: the picker lists them,
// picking one reconnects the page to it (a new chat), and a turn there is answered.
// Usage: node browser_models.js URL MODEL   (prints a JSON summary as its last line)
"use strict";
const { withPage } = require("./chromium_page");

const [url, pick] = process.argv.slice(2);

async function main() {
  await withPage(async (page) => {
    const hellos = [];  // the model each of the page's sockets was bound to
    page.on("websocket", (ws) => ws.on("framereceived", ({ payload }) => {
      const frame = JSON.parse(payload.toString());
      if (frame.type === "hello") hellos.push(frame.model);
    }));
    await page.goto(url);
    await page.waitForSelector("#status.on", { timeout: 60000 });
    await page.waitForSelector("#models:not([hidden])", { timeout: 30000 });
    const options = await page.$$eval("#models option", (els) => els.map((e) => e.value));
    const before = await page.inputValue("#models");
    await page.selectOption("#models", pick);
    while (hellos.length < 2) await new Promise((r) => setTimeout(r, 100));
    await page.waitForSelector("#status.on", { timeout: 60000 });
    await page.fill("#input", "Hi");
    await page.keyboard.press("Enter");
    await page.waitForSelector(".msg.assistant .meta", { timeout: 120000 });
    const shown = await page.textContent("#model");
    console.log(JSON.stringify({ options, before, hellos, shown }));
  });
}

main().catch((err) => { console.error(err); process.exit(1); });
