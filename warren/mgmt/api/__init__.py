"""HTTP API resources, one module per concept. Each module defines `routes`, an
aiohttp.web.RouteTableDef, registered by warren.mgmt.app.make_app."""
