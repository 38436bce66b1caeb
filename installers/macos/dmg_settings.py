# dmgbuild settings for the macOS disk image:
#   dmgbuild -s installers/macos/dmg_settings.py -D app=build/installers/Cotrain.app "Cotrain" Cotrain.dmg
import os.path

application = defines.get("app", "build/installers/Cotrain.app")  # noqa: F821 - dmgbuild injects `defines`
appname = os.path.basename(application)

format = "UDZO"
size = None
files = [application]
symlinks = {"Applications": "/Applications"}
badge_icon = None
icon_locations = {appname: (140, 120), "Applications": (500, 120)}
background = "builtin-arrow"
window_rect = ((100, 100), (640, 280))
default_view = "icon-view"
show_icon_preview = False
icon_size = 128
text_size = 14
