"""An import-linter contract type that forbidden contracts cannot express: no module imports a test module.

Import-linter's module expressions match whole name parts (`tests.*.test_*` is no expression), so "no test_*
module is imported" is this contract (`.importlinter-tests`). Shared helpers belong in tests/support."""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


class NoTestModuleImportsContract(Contract):
    """No module under `containers` imports a module whose last name part starts with `test_`."""

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        containers = [str(name) for name in self.containers]  # type: ignore[attr-defined]
        found: list[tuple[str, str, list[int]]] = []
        for container in containers:
            for importer in sorted({container} | graph.find_descendants(container)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if imported != importer and is_test_module(imported):
                        details = graph.get_import_details(importer=importer, imported=imported)
                        found.append((importer, imported, [int(d["line_number"]) for d in details]))
        return ContractCheck(kept=not found, warnings=[], metadata={"imports": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["imports"]:
            where = ", ".join(f"l.{line}" for line in lines)
            output.print_error(f"{importer} -> {imported} ({where})", bold=False)
            output.new_line()
        output.print("Move what is shared into tests/support and import it from there.")
