import { defineConfig } from "vite";

// Served by `switchyard serve --ui` at /ui/ from files embedded into the binary: relative asset
// URLs, and fixed file names so that a rebuild changes the embedded table only when the code does.
export default defineConfig({
  base: "./",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2020",
    modulePreload: { polyfill: false },
    rollupOptions: {
      output: {
        entryFileNames: "assets/[name].js",
        chunkFileNames: "assets/[name].js",
        assetFileNames: "assets/[name][extname]",
      },
    },
  },
});
