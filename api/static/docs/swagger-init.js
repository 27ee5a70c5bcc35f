"use strict";
// Swagger UI's start-up, as a file of the API's own: the page's Content-Security-Policy allows
// no inline script. The page names the schema's URL on the element the UI renders into.
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapiUrl,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  // Otherwise the page shows a badge that sends the schema to validator.swagger.io.
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
