// Command podcheck is the real node's in-pod probe for the e2e tests: it checks what a pod sees of the
// cluster (DNS, Services, the API server with its ServiceAccount) from inside the pod, where the kubelet's
// /etc/resolv.conf and the projected token apply. Each argument is one check, run in order:
//
//	lookup:NAME   resolve NAME with the pod's resolver (search domains, ndots)
//	get:URL       HTTP GET URL (the host part is resolved the same way)
//	apiget:URL    HTTPS GET URL with the pod's ServiceAccount token and CA (/var/run/secrets/kubernetes.io/serviceaccount)
//
// Each check prints one JSON line ({"check", "arg", "ok", "status", "body" or "error", "attempts"}).
// A check is retried on transport errors (DNS or a Service may not be programmed yet) until $DEADLINE
// (default 60s) from start; an HTTP answer of any status ends it. Exit status 0 when every check got an
// answer, 1 otherwise. Standard library only, static.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"

type result struct {
	Check    string `json:"check"`
	Arg      string `json:"arg"`
	OK       bool   `json:"ok"`
	Status   int    `json:"status,omitempty"`
	Body     string `json:"body,omitempty"`
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts"`
}

func main() {
	deadline := 60 * time.Second
	if d, err := time.ParseDuration(os.Getenv("DEADLINE")); err == nil {
		deadline = d
	}
	until := time.Now().Add(deadline)
	failed := false
	for _, arg := range os.Args[1:] {
		check, target, _ := strings.Cut(arg, ":")
		r := result{Check: check, Arg: target}
		for {
			r.Attempts++
			var err error
			switch check {
			case "lookup":
				r.Body, err = lookup(target)
			case "get":
				r.Status, r.Body, err = get(http.DefaultClient, target, "")
			case "apiget":
				r.Status, r.Body, err = apiget(target)
			default:
				err = fmt.Errorf("unknown check %q (lookup, get, apiget)", check)
				until = time.Now()
			}
			r.OK, r.Error = err == nil, ""
			if err != nil {
				r.Error = err.Error()
			}
			if r.OK || time.Now().After(until) {
				break
			}
			time.Sleep(500 * time.Millisecond) // retry interval of a deadline-bounded check
		}
		line, _ := json.Marshal(r)
		fmt.Println(string(line))
		failed = failed || !r.OK
	}
	if failed {
		os.Exit(1)
	}
}

func lookup(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	return strings.Join(addrs, ","), err
}

func get(client *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// apiget reads the token and CA on every attempt: the kubelet writes the projected volume before the
// container starts, but a rotated token replaces the file.
func apiget(url string) (int, string, error) {
	token, err := os.ReadFile(serviceAccount + "/token")
	if err != nil {
		return 0, "", err
	}
	ca, err := os.ReadFile(serviceAccount + "/ca.crt")
	if err != nil {
		return 0, "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return 0, "", fmt.Errorf("no certificate in %s/ca.crt", serviceAccount)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return get(client, url, strings.TrimSpace(string(token)))
}
