//! The page's inline style sheet (the page loads nothing from elsewhere).

pub(super) const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24;background:#fafafa}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;vertical-align:top}\
th{background:#eee}.ok{color:#176f2c}.warn{color:#9a6700;font-weight:600}.bad{color:#b3261e;font-weight:600}\
.muted{color:#666}code{font-size:.95em}";
