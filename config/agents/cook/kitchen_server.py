"""The example MCP server of the `cook` agent: unit conversions and recipe scaling.

A stdio server built with the official SDK (`mcp`); Pluto starts it when the agent first needs
it and stops it when idle. Try it alone with: python3 kitchen_server.py (it then waits for
JSON-RPC on stdin).
"""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("kitchen", log_level="WARNING")

# everything in grams (mass) or millilitres (volume)
MASS = {"g": 1.0, "kg": 1000.0, "oz": 28.349523125, "lb": 453.59237}
VOLUME = {"ml": 1.0, "l": 1000.0, "tsp": 4.92892159375, "tbsp": 14.78676478125,
          "cup": 236.5882365, "fl_oz": 29.5735295625}


@server.tool()
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a kitchen quantity between units of mass (g, kg, oz, lb) or of volume
    (ml, l, tsp, tbsp, cup, fl_oz); also temperatures (c, f)."""
    a, b = from_unit.strip().lower(), to_unit.strip().lower()
    if {a, b} <= {"c", "f"}:
        out = value if a == b else (value * 9 / 5 + 32 if a == "c" else (value - 32) * 5 / 9)
        return f"{value:g} °{a.upper()} = {out:.0f} °{b.upper()}"
    for table in (MASS, VOLUME):
        if a in table and b in table:
            return f"{value:g} {a} = {value * table[a] / table[b]:.3g} {b}"
    raise ToolError(f"cannot convert {from_unit} to {to_unit}: use two units of mass "
                    f"({', '.join(MASS)}), of volume ({', '.join(VOLUME)}), or c and f")


@server.tool()
def scale(ingredients: list[str], factor: float) -> str:
    """Scale a recipe's ingredient lines ("200 g flour") by a factor (2 doubles it)."""
    if not 0 < factor <= 100:
        raise ToolError("the factor must be above 0 and at most 100")
    out = []
    for line in ingredients:
        amount, _, rest = line.strip().partition(" ")
        try:
            out.append(f"{float(amount) * factor:g} {rest}")
        except ValueError:
            out.append(line.strip())  # "a pinch of salt" stays as it is
    return "\n".join(out)


if __name__ == "__main__":
    server.run("stdio")
