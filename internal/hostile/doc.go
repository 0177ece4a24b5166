// Package hostile holds the hostile-http scenario: adversarial requests
// against the real WeChat callback endpoint and the real admin API, served
// by the daemons' own wiring (internal/service) on the real services. It
// has no code outside its tests.
package hostile
