//! `kiln-web-check`: the browser demo as a visitor's browser runs it. Serves the built page (`--dist`),
//! starts chromedriver and drives headless Chromium through WebDriver (with SwiftShader's WebGPU, or with
//! no WebGPU at all: `--webgpu off`), opens the page asking for runs of built-in workloads and lines of
//! the expression language, waits for the page to publish its results, saves a screenshot, and fails on
//! a run that disagrees with the reference, a good line that did not run, a bad line that was not
//! rejected, a console error, or a timeout.

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    match native::main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln-web-check: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use clap::Parser;
    use kiln_web::state;
    use serde_json::{json, Value};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// Checks the built browser demo in headless Chromium.
    #[derive(Parser)]
    struct Args {
        /// The built page (`scripts/web.sh build` writes it).
        #[arg(long, default_value = "web/dist")]
        dist: PathBuf,
        /// Where the screenshot and the page's results go.
        #[arg(long, default_value = "target/web-check")]
        out: PathBuf,
        /// `on`: Chromium's WebGPU on SwiftShader; `off`: WebGPU switched off (the page must fall back).
        #[arg(long, value_enum, default_value_t = WebGpu::On)]
        webgpu: WebGpu,
        /// Built-in workloads the page runs.
        #[arg(long, default_value = "W1,W2,W3")]
        run: String,
        /// Timed calls per mode.
        #[arg(long, default_value_t = 5)]
        calls: usize,
        /// Seconds to wait for the page to finish.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// The chromedriver binary.
        #[arg(long, default_value = "/usr/bin/chromedriver")]
        chromedriver: PathBuf,
        /// The Chromium binary.
        #[arg(long, default_value = "/usr/bin/chromium")]
        chromium: PathBuf,
    }

    /// Whether the browser offers WebGPU.
    #[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
    enum WebGpu {
        On,
        Off,
    }

    impl std::fmt::Display for WebGpu {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(if *self == WebGpu::On { "on" } else { "off" })
        }
    }

    /// Lines the page must reject, each with a word its message must contain.
    const BAD_LINES: [(&str, &str); 3] =
        [("x +* 2", "column 4"), ("frobnicate(x)", "unknown function"), ("x + w", "broadcast")];
    /// A line the page must compile and run.
    const GOOD_LINE: &str = "gelu(x*1.5+0.5)*sigmoid(x)";

    /// Serves the page, starts chromedriver, and checks the page (see the module doc).
    pub fn main() -> Result<(), String> {
        let args = Args::parse();
        if !args.dist.join("index.html").is_file() || !args.dist.join("kiln_web_bg.wasm").is_file() {
            return Err(format!("{} holds no built page: run `scripts/web.sh build` first", args.dist.display()));
        }
        for (what, p) in [("chromedriver", &args.chromedriver), ("chromium", &args.chromium)] {
            if !p.is_file() {
                return Err(format!(
                    "{what} not found at {}: install Debian's chromium and chromium-driver",
                    p.display()
                ));
            }
        }
        std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
        let site = serve(&args.dist)?;
        let driver = Driver::start(&args.chromedriver)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(check(&args, site, driver.port))
    }

    /// Serves `dist` on a free loopback port from a thread; returns the port.
    fn serve(dist: &Path) -> Result<u16, String> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| format!("serving the page: {e}"))?;
        let port = server.server_addr().to_ip().map(|a| a.port()).ok_or("the server has no port")?;
        let dist = dist.to_path_buf();
        std::thread::spawn(move || {
            for request in server.incoming_requests() {
                let path = request.url().split('?').next().unwrap_or("/").trim_start_matches('/').to_string();
                let path = if path.is_empty() { "index.html".to_string() } else { path };
                let file = dist.join(&path);
                let inside = !path.split('/').any(|p| p == "..");
                let response = match std::fs::read(&file) {
                    Ok(bytes) if inside => {
                        let kind = match file.extension().and_then(|e| e.to_str()) {
                            Some("html") => "text/html; charset=utf-8",
                            Some("js") => "text/javascript",
                            Some("wasm") => "application/wasm",
                            Some("png") => "image/png",
                            _ => "application/octet-stream",
                        };
                        let header = tiny_http::Header::from_bytes("Content-Type", kind).expect("a valid header");
                        tiny_http::Response::from_data(bytes).with_header(header).boxed()
                    }
                    _ => tiny_http::Response::from_string("not found").with_status_code(404).boxed(),
                };
                let _ = request.respond(response);
            }
        });
        Ok(port)
    }

    /// chromedriver on a free port, stopped when dropped.
    struct Driver {
        child: Child,
        port: u16,
    }

    impl Driver {
        fn start(bin: &Path) -> Result<Driver, String> {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| e.to_string())?
                .port();
            let child = Command::new(bin)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", bin.display()))?;
            let driver = Driver { child, port };
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if start.elapsed() > Duration::from_secs(30) {
                    return Err("chromedriver did not start listening within 30 s".into());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(driver)
        }
    }

    impl Drop for Driver {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn chrome_args(args: &Args, profile: &Path) -> Vec<String> {
        let mut v: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,900",
            // WebGL for the UI on SwiftShader (no GPU here).
            "--use-angle=swiftshader",
            "--enable-unsafe-swiftshader",
        ]
        .map(String::from)
        .to_vec();
        if args.webgpu == WebGpu::Off {
            v.push("--disable-features=WebGPU".into());
        } else {
            v.extend(
                [
                    "--enable-unsafe-webgpu",
                    "--enable-features=Vulkan",
                    "--use-vulkan=swiftshader",
                    "--use-webgpu-adapter=swiftshader",
                ]
                .map(String::from),
            );
        }
        v.push(format!("--user-data-dir={}", profile.display()));
        v
    }

    async fn check(args: &Args, site: u16, driver: u16) -> Result<(), String> {
        let profile = std::env::temp_dir().join(format!("kiln-web-check-{}", std::process::id()));
        let result = drive(args, site, driver, &profile).await;
        let _ = std::fs::remove_dir_all(&profile);
        result
    }

    async fn drive(args: &Args, site: u16, driver: u16, profile: &Path) -> Result<(), String> {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": args.chromium, "args": chrome_args(args, profile) }),
        );
        let client = fantoccini::ClientBuilder::rustls()
            .map_err(|e| e.to_string())?
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{driver}"))
            .await
            .map_err(|e| format!("connecting to chromedriver: {e}"))?;
        let mut query: Vec<String> = vec![format!("run={}", args.run), format!("calls={}", args.calls)];
        for line in BAD_LINES.iter().map(|(l, _)| *l).chain([GOOD_LINE]) {
            query.push(format!("expr={}", encode(line)));
        }
        let url = format!("http://127.0.0.1:{site}/index.html?{}", query.join("&"));
        println!("kiln-web-check: opening {url} (WebGPU {})", args.webgpu);
        client.goto(&url).await.map_err(|e| format!("opening the page: {e}"))?;
        let start = Instant::now();
        let (state, text, errors) = loop {
            let v = client
                .execute(
                    "const s = document.getElementById('kiln-status'); return [s ? s.dataset.state : 'missing', s ? s.textContent : '', window.kilnErrors || []];",
                    vec![],
                )
                .await
                .map_err(|e| format!("reading the page: {e}"))?;
            let state = v[0].as_str().unwrap_or_default().to_string();
            if state == state::DONE || state == state::FAILED || start.elapsed() > Duration::from_secs(args.timeout) {
                break (state, v[1].as_str().unwrap_or_default().to_string(), v[2].clone());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let elapsed = start.elapsed().as_secs_f64();
        let shot = args.out.join(format!("page-webgpu-{}.png", args.webgpu));
        match client.screenshot().await {
            Ok(png) => std::fs::write(&shot, png).map_err(|e| format!("{}: {e}", shot.display()))?,
            Err(e) => eprintln!("kiln-web-check: no screenshot: {e}"),
        }
        let _ = client.close().await;
        let results = args.out.join(format!("page-webgpu-{}.json", args.webgpu));
        let _ = std::fs::write(&results, &text);
        println!("kiln-web-check: state `{state}` after {elapsed:.1} s; screenshot {}", shot.display());
        let errors: Vec<String> = errors
            .as_array()
            .map(|a| a.iter().map(|e| e.as_str().unwrap_or_default().to_string()).collect())
            .unwrap_or_default();
        judge(args, &state, &text, &errors)
    }

    /// Every way the page can be wrong, each reported.
    fn judge(args: &Args, state: &str, text: &str, errors: &[String]) -> Result<(), String> {
        let mut wrong: Vec<String> = errors.iter().map(|e| format!("console error: {e}")).collect();
        if state != state::DONE {
            wrong.push(format!("the page ended `{state}` (wanted `{}`): {text}", state::DONE));
        }
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let notice = v["notice"].as_str().unwrap_or_default();
        println!("kiln-web-check: {notice}");
        let wanted_notice = if args.webgpu == WebGpu::On { "WebGPU device:" } else { "no WebGPU device" };
        if !notice.contains(wanted_notice) {
            wrong.push(format!("the page's notice `{notice}` does not say `{wanted_notice}`"));
        }
        let runs = v["runs"].as_array().cloned().unwrap_or_default();
        for r in &runs {
            let times: Vec<String> = r["times"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .map(|t| {
                            let device = t["device_ms"].as_f64().map_or(String::new(), |d| format!(" (device {d:.3})"));
                            format!(
                                "{} {:.3} ms{device}",
                                t["mode"].as_str().unwrap_or("?"),
                                t["ms"].as_f64().unwrap_or(f64::NAN)
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            println!("  {}: {} — correct: {}", r["title"].as_str().unwrap_or("?"), times.join(", "), r["correct"]);
            if let Some(how) = r["device_timing"].as_str() {
                println!("    device times from {how}");
            }
            // A device time is part of its call + wait (timestamps are coarse in browsers: 0.1 ms slack).
            for t in r["times"].as_array().into_iter().flatten() {
                if let (Some(d), Some(ms)) = (t["device_ms"].as_f64(), t["ms"].as_f64()) {
                    if !(0.0..=ms + 0.1).contains(&d) {
                        wrong.push(format!("run {}: device time {d} ms outside its call's {ms} ms", r["title"]));
                    }
                }
            }
            if r["correct"].as_bool() != Some(true) {
                wrong.push(format!("run {} disagrees with the reference or failed: {r}", r["title"]));
            }
        }
        for id in args.run.split(',').filter(|s| !s.is_empty()) {
            let title = format!("{id} (quick size)");
            if !runs.iter().any(|r| r["title"].as_str() == Some(&title)) {
                wrong.push(format!("no run of {id} in the page's results"));
            }
        }
        if !runs.iter().any(|r| r["title"].as_str() == Some(&format!("`{GOOD_LINE}`"))) {
            wrong.push(format!("the expression `{GOOD_LINE}` did not run"));
        }
        let rejected = v["rejected"].as_array().cloned().unwrap_or_default();
        for (line, word) in BAD_LINES {
            let r = rejected.iter().find(|r| r["expression"].as_str() == Some(line));
            let msg = r.and_then(|r| r["error"].as_str()).unwrap_or_default();
            println!("  `{line}` rejected: {msg}");
            if !msg.contains(word) {
                wrong.push(format!("`{line}` was not rejected with a message saying `{word}`"));
            }
        }
        if wrong.is_empty() {
            println!("kiln-web-check: the page passed (WebGPU {})", args.webgpu);
            Ok(())
        } else {
            Err(wrong.join("\n"))
        }
    }

    /// Percent-encodes a query value.
    fn encode(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
}
