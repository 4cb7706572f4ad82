/** This library's version (package.json's; test/package.test.mjs checks they agree). */
export const VERSION = "0.1.0";
