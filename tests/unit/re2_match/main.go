// Reads {"patterns": [...], "inputs": [...]} on stdin and writes, for each pattern, whether Go's regexp
// (RE2 syntax and semantics: the engine CEL's matches() runs on in the API server) matches each input.
package main

import (
	"encoding/json"
	"os"
	"regexp"
)

func main() {
	var request struct {
		Patterns []string `json:"patterns"`
		Inputs   []string `json:"inputs"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&request); err != nil {
		panic(err)
	}
	results := make([][]bool, len(request.Patterns))
	for i, pattern := range request.Patterns {
		compiled := regexp.MustCompile(pattern)
		results[i] = make([]bool, len(request.Inputs))
		for j, input := range request.Inputs {
			results[i][j] = compiled.MatchString(input)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		panic(err)
	}
}
