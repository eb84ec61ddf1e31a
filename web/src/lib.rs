//! The browser door to weft (wasm-bindgen, a Web Worker and the demo page) arrives with the web
//! issue. Until then this crate only proves the library links into a wasm-targeted crate.

pub use weft;
