"""A 19-column table in the widget, in Chromium (issue 17): no cell narrower than its longest
word, the table scrolls sideways inside its bubble, numbers right-aligned — both for a table
the model writes and for a query result (``/sql``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import playwright.async_api as playwright_api

from pluto.runtime.testing import Scripted, ScriptedModel
from tests.browser.test_widget_browser import ARGS, CHROMIUM
from tests.helpers.served import served, url

COLUMNS = ["carrier", "origin", "destination", "tailnum", "flight", "dep_time", "dep_delay",
           "arr_time", "arr_delay", "air_time", "distance", "hour", "minute", "year", "month",
           "day", "sched_dep_time", "sched_arr_time", "time_hour"]
ROW = ["United Air Lines Inc.", "Newark Liberty International", "George Bush Intercontinental",
       "N14228", "1545", "517", "2", "830", "11", "227", "1,400", "5", "15", "2013", "1", "1",
       "515", "819", "2013-01-01T05:00:00"]
NUMERIC = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
TABLE = ("Here are the flights:\n\n| " + " | ".join(COLUMNS) + " |\n|"
         + "|".join("---" for _ in COLUMNS) + "|\n" + ("| " + " | ".join(ROW) + " |\n") * 3)

# For each cell: its content width, and the width of its longest word laid out on one line
# in the cell's own font.
MEASURE = """
(table) => Array.from(table.querySelectorAll("th, td")).map((cell) => {
  const style = getComputedStyle(cell);
  const inner = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  let longest = 0, word = "";
  for (const w of cell.textContent.split(/\\s+/)) {
    if (!w) continue;
    const probe = document.createElement("span");
    probe.style.whiteSpace = "nowrap";
    probe.style.display = "inline-block";
    probe.textContent = w;
    cell.appendChild(probe);
    if (probe.getBoundingClientRect().width > longest) {
      longest = probe.getBoundingClientRect().width; word = w;
    }
    probe.remove();
  }
  return {inner, longest, word, align: style.textAlign, text: cell.textContent};
})
"""


async def check_table(table: Any) -> list[dict[str, Any]]:
    cells = await table.evaluate(MEASURE)
    assert len(cells) == 19 * 4
    narrow = [c for c in cells if c["inner"] + 0.5 < c["longest"]]
    assert not narrow, f"cells narrower than their longest word: {narrow[:3]}"
    wrapper = table.locator("xpath=..")
    scroll = await wrapper.evaluate("(w) => [w.scrollWidth, w.clientWidth]")
    assert scroll[0] > scroll[1], "a 19-column table scrolls sideways inside its bubble"
    return cells


async def test_a_19_column_table_is_readable_in_the_widget(config_dir: Path, data_dir: Path,
                                                          tmp_path: Path) -> None:
    model = ScriptedModel(Scripted(text=TABLE, chunk=400))
    async with served(config_dir, data_dir, model) as gw, \
            playwright_api.async_playwright() as pw:
        assert CHROMIUM.exists(), "needs Debian's chromium: apt-get install -y chromium"
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(url(gw, "/"))
            expect = playwright_api.expect
            await expect(page.locator(".pluto-status")).to_have_text("Online")
            await page.locator(".pluto-input").fill("show me the flights")
            await page.locator(".pluto-input").press("Enter")
            table = page.locator(".pluto-bot table").first
            await expect(table.locator("tbody tr")).to_have_count(3)
            cells = await check_table(table)
            body = cells[19:38]
            assert [c["align"] for i, c in enumerate(body) if i in NUMERIC] == ["right"] * 14
            assert body[0]["align"] in ("left", "start")
            await page.screenshot(path=str(tmp_path / "table.png"))

            await page.locator(".pluto-input").fill(
                "/sql SELECT " + ", ".join(f"{i} * 1000 + 0.5 AS \"{c}\"" if i in NUMERIC
                                           else f"'{ROW[i]}' AS \"{c}\""
                                           for i, c in enumerate(COLUMNS))
                + " FROM range(3)")
            await page.locator(".pluto-input").press("Enter")
            result = page.locator(".pluto-bot table").nth(1)
            await expect(result.locator("tbody tr")).to_have_count(3)
            cells = await check_table(result)
            assert [c["align"] for i, c in enumerate(cells[19:38]) if i in NUMERIC] == \
                ["right"] * 14
            await page.screenshot(path=str(tmp_path / "sql.png"), full_page=True)
            assert errors == []
        finally:
            await browser.close()
